"""static/js/shared/protocol.js mirrors the server's protocol exactly, and the page's scripts rely on
nothing else.

protocol.js is hand-written (the page has no build step), so this test is what keeps it honest: it
reads the JSON between the `protocol-json` markers and compares it with model_runner/protocol/events.py (type
names, fields, their JSON kinds, the terminal set), and with the server code that builds model
facts, budgets and metrics. It then scans static/js for event types written as string literals and
for snake_case names read off server objects that neither protocol.js nor the static data declare.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from model_runner.protocol import events

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "static/js"
PROTOCOL_JS = JS / "shared/protocol.js"
SOURCE = PROTOCOL_JS.read_text(encoding="utf-8")

pytestmark = pytest.mark.unit


def _spec() -> dict:
    found = re.search(r"/\* protocol-json \*/(.*?)/\* /protocol-json \*/", SOURCE, re.DOTALL)
    assert found, "protocol.js lost its /* protocol-json */ … /* /protocol-json */ block"
    return json.loads(found.group(1))


SPEC = _spec()


def _kind(annotation) -> str:
    """The JSON kind of a dataclass field, from its annotation (a string while events.py uses
    `from __future__ import annotations`, else the type itself)."""
    if not isinstance(annotation, str):
        annotation = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    annotation = annotation.replace(" ", "")
    if annotation.endswith("|None"):
        return _kind(annotation[: -len("|None")]) + "?"
    simple = {"int": "int", "float": "num", "str": "str", "bool": "bool"}
    if annotation in simple:
        return simple[annotation]
    if annotation.startswith("dict["):
        return "obj"
    if annotation.startswith("list["):
        return "arr"
    raise AssertionError(f"test_js_protocol does not know the JSON kind of {annotation!r}: teach _kind() it")


def _fields(cls) -> dict[str, str]:
    return {f.name: _kind(f.type) for f in dataclasses.fields(cls)}


COMMON = _fields(events.Event)


def test_the_schema_version_matches():
    assert SPEC["schema"] == events.SCHEMA_VERSION


def test_common_fields_match_the_event_base_class():
    # `type` is a ClassVar and `schema` is added by to_dict(): both are on every event's JSON.
    assert SPEC["common"] == {"type": "str", "schema": "int", **COMMON}


def test_event_types_match_exactly():
    assert set(SPEC["events"]) == set(events.EVENT_TYPES)


@pytest.mark.parametrize("event_type", sorted(events.EVENT_TYPES))
def test_each_event_lists_exactly_the_dataclass_fields_and_kinds(event_type):
    cls = events.EVENT_TYPES[event_type]
    expected = {name: kind for name, kind in _fields(cls).items() if name not in COMMON}
    assert SPEC["events"].get(event_type) == expected, (
        f"protocol.js's {event_type!r} does not mirror events.{cls.__name__}: update static/js/shared/protocol.js"
    )


def test_candidate_fields_match():
    assert SPEC["candidate"] == _fields(events.Candidate)


def test_mask_fields_match():
    from model_runner.shared.constraints import MaskFacts

    assert SPEC["mask"] == _fields(MaskFacts)


def test_the_terminal_set_matches():
    assert set(SPEC["terminal"]) == set(events.TERMINAL_TYPES)
    assert len(SPEC["terminal"]) == len(set(SPEC["terminal"]))


def test_the_event_constants_name_every_type_once():
    block = re.search(r"export const EVENT = Object\.freeze\(\{(.*?)\}\);", SOURCE, re.DOTALL)
    assert block, "protocol.js must define `export const EVENT = Object.freeze({...});`"
    pairs = re.findall(r"([A-Z_]+):\s*'([a-z_]+)'", block.group(1))
    assert sorted(value for _, value in pairs) == sorted(events.EVENT_TYPES)
    assert all(key == value.upper() for key, value in pairs)


# ---- the server code that builds what `model`, `budget` and `metrics` name -------------------------


def _tree(relative: str) -> ast.Module:
    return ast.parse((ROOT / relative).read_text(encoding="utf-8"))


def _model_fact_names() -> set[str]:
    """ModelFacts' fields and properties, read with ast: importing loader.py would import torch."""
    cls = next(
        n
        for n in ast.walk(_tree("model_runner/loading/loader.py"))
        if isinstance(n, ast.ClassDef) and n.name == "ModelFacts"
    )
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    names |= {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)
    }
    return names


def _dict_keys(relative: str, is_target) -> set[str]:
    keys: set[str] = set()
    for node in ast.walk(_tree(relative)):
        value = None
        if isinstance(node, ast.Assign) and any(is_target(t) for t in node.targets):
            value = node.value
        elif isinstance(node, ast.FunctionDef) and is_target(node):
            value = next((n.value for n in ast.walk(node) if isinstance(n, ast.Return)), None)
        if isinstance(value, ast.Dict):
            keys |= {k.value for k in value.keys if isinstance(k, ast.Constant)}
    return keys


def test_model_facts_the_page_reads_exist():
    assert set(SPEC["model"]) <= _model_fact_names()


def test_budget_fields_the_page_reads_exist():
    keys = _dict_keys("model_runner/text/prompt.py", lambda t: isinstance(t, ast.Attribute) and t.attr == "budget")
    assert keys, "could not find `view.budget = {...}` in model_runner/text/prompt.py"
    assert set(SPEC["budget"]) <= keys


def test_metrics_the_page_reads_exist():
    keys = _dict_keys(
        "model_runner/protocol/metrics.py", lambda t: isinstance(t, ast.FunctionDef) and t.name == "request_metrics"
    )
    assert keys, "could not find request_metrics() returning a dict in model_runner/protocol/metrics.py"
    assert set(SPEC["metrics"]) <= keys


# ---- the scripts use protocol.js, not copies of it ---------------------------------------------------

SCRIPTS = sorted(p for p in JS.rglob("*.js") if p != PROTOCOL_JS)
# Block comments, and line comments at the start of a line or after a space (not `${scheme}//` or `http://`).
COMMENT = re.compile(r"/\*.*?\*/|(?:^|(?<=\s))//[^\n]*", re.DOTALL | re.MULTILINE)


def _code(path: Path) -> str:
    return COMMENT.sub("", path.read_text(encoding="utf-8"))


def _where(pattern: re.Pattern) -> list[str]:
    return [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in SCRIPTS for m in pattern.finditer(_code(p))]


def test_event_types_are_compared_through_the_constants():
    # `e.type === 'token'` keeps working when the server renames `token`; `e.type === EVENT.TOKEN` fails here.
    assert _where(re.compile(r"\.type\s*[!=]==?\s*['\"`][^'\"`]*['\"`]")) == []
    prefill = "|".join(t for t in events.EVENT_TYPES if "_" in t)  # names that can only be event types
    assert _where(re.compile(rf"['\"`]({prefill})['\"`]")) == []
    assert _where(re.compile(r"new Set\(\[\s*'finished'")) == [], "use isTerminal() from shared/protocol.js"


def test_every_event_constant_used_exists():
    used = {m.group(1) for p in SCRIPTS for m in re.finditer(r"\bEVENT\.([A-Za-z_]+)", _code(p))}
    assert used, "no script uses EVENT.* from shared/protocol.js"
    assert used <= {t.upper() for t in events.EVENT_TYPES}


def _data_keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _data_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _data_keys(v)}
    return set()


def test_every_server_name_the_scripts_read_is_declared():
    """Page code is camelCase, so a snake_case property read (`e.step_ms`, `{ prompt_tokens: p } =`)
    is a name from the server or from a data file. Each must be declared in protocol.js or appear in
    the static data the page loads (the calculator's golden cases; the shipped trace's request and
    prompt, but not its events or model facts, which protocol.js alone declares: a recording made
    before a rename must not vouch for the old name)."""
    declared = (
        set(SPEC["common"]) | set(SPEC["candidate"]) | set(SPEC["mask"]) | set(SPEC["model"]) | set(SPEC["budget"])
    )
    declared |= set(SPEC["metrics"]) | {f for fields in SPEC["events"].values() for f in fields}
    declared |= {f for fields in SPEC["feed"].values() for f in fields} | set(SPEC["batch_row"]) | set(SPEC["kv"])
    for group in ("policy", "class_settings", "class_info", "experiments_list", "experiment_results"):
        declared |= set(SPEC[group])
    # the invariance stage also reads a live answer that parts: the fields of the recorded run that did
    for data in [*(ROOT / "static/data").glob("*.json"), ROOT / "tests/data/invariance-parted.json"]:
        value = json.loads(data.read_text(encoding="utf-8"))
        if isinstance(value, dict) and value.get("format") == "kvscope-trace":
            value = {k: v for k, v in value.items() if k not in ("events", "model")}
        declared |= _data_keys(value)
    read = re.compile(r"\??\.([a-z][a-z0-9]*_[a-z0-9_]+)\b|\{([^{}]*)\}\s*=(?!=)")
    unknown = []
    for path in SCRIPTS:
        for m in read.finditer(_code(path)):
            names = [m.group(1)] if m.group(1) else re.findall(r"\b([a-z][a-z0-9]*_[a-z0-9_]+)\s*:", m.group(2) or "")
            unknown += [f"{path.relative_to(ROOT)}: {n}" for n in names if n not in declared]
    assert unknown == [], "declare these in static/js/shared/protocol.js (or fix the name)"


# ---- the engine feed and the class messages: built as dicts, so checked against the names the server uses -----

FEED_SOURCES = (
    "model_runner/local/engine.py",
    "model_runner/local/announce.py",
    "model_runner/local/kv_cache.py",
    "model_runner/shared/feed.py",
    "model_runner/shared/endings.py",
    "app/classroom/routes.py",
    "app/classroom/room.py",
    "app/ws/session.py",
)


def _server_names(relative: str) -> set[str]:
    """Every string constant, keyword argument and annotated field name in a server module: the names
    a dict or a dataclass built there can carry."""
    names: set[str] = set()
    for node in ast.walk(_tree(relative)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _dataclass_fields(relative: str, name: str) -> list[str]:
    cls = next(n for n in ast.walk(_tree(relative)) if isinstance(n, ast.ClassDef) and n.name == name)
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def test_the_feed_constants_name_every_feed_type_once():
    block = re.search(r"export const FEED = Object\.freeze\(\{(.*?)\}\);", SOURCE, re.DOTALL)
    assert block, "protocol.js must define `export const FEED = Object.freeze({...});`"
    pairs = re.findall(r"([A-Z_]+):\s*'([a-z_]+)'", block.group(1))
    assert sorted(value for _, value in pairs) == sorted(SPEC["feed"])
    assert all(key == value.upper() for key, value in pairs)


def test_every_feed_type_and_field_the_page_reads_is_one_the_server_sends():
    server = set().union(*(_server_names(path) for path in FEED_SOURCES))
    missing = [t for t in SPEC["feed"] if t not in server]
    missing += [f"{t}.{f}" for t, fields in SPEC["feed"].items() for f in fields if f not in server]
    missing += [f"batch_row.{f}" for f in SPEC["batch_row"] if f not in server]
    missing += [f"kv.{f}" for f in SPEC["kv"] if f not in server]
    assert missing == []


def test_policy_and_class_settings_match_their_dataclasses():
    assert SPEC["policy"] == _dataclass_fields("model_runner/shared/policy.py", "Policy")
    assert SPEC["class_settings"] == _dataclass_fields("app/classroom/room.py", "Settings")
    assert set(SPEC["class_info"]) <= _server_names("app/classroom/routes.py")
    assert set(SPEC["experiments_list"]) <= _server_names("app/experiments.py")
    assert set(SPEC["experiment_results"]) <= _server_names("serving_experiments/roofline.py")


def test_every_feed_constant_used_exists():
    used = {m.group(1) for p in SCRIPTS for m in re.finditer(r"\bFEED\.([A-Za-z_]+)", _code(p))}
    assert used <= {t.upper() for t in SPEC["feed"]}
