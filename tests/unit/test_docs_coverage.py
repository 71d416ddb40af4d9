"""docs/protocol.md covers the app, in the datasette manner: every route in `app.url_map` is in its
routes table and every key of the config's defaults (app.DEFAULTS) is in its configuration table
with the default the code has; neither table names anything the app no longer has."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app import DEFAULTS, create_app
from serving_experiments.registry import EXPERIMENTS

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
IGNORED_METHODS = {"HEAD", "OPTIONS"}  # Flask adds them to every route


def section(heading: str) -> str:
    text = PROTOCOL.read_text(encoding="utf-8")
    assert heading in text, f"docs/protocol.md has no {heading!r}"
    return re.split(r"\n#{2,3} ", text.split(heading, 1)[1], maxsplit=1)[0]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the markdown tables in `text`, as stripped cells (headers left out)."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("- :"):  # the separator: the row above it was the header
            rows.pop()
        else:
            rows.append(cells)
    return rows


def documented_routes() -> set[str]:
    return {row[0].strip("`") for row in table_rows(section("### Routes")) if row[0].startswith("`")}


def documented_defaults() -> dict[str, str]:
    rows = table_rows(section("## Limits and configuration"))
    return {row[0].strip("`"): row[1] for row in rows if row[0].startswith("`")}


@pytest.fixture(scope="module")
def app():
    class Bare:  # routes and config only: no model is needed to build the app
        facts = None

        def add_end_listener(self, fn):
            pass

    return create_app({"TESTING": True, "ENGINE": Bare()})


def served_routes(app) -> set[str]:
    return {f"{method} {rule.rule}" for rule in app.url_map.iter_rules() for method in rule.methods - IGNORED_METHODS}


def test_every_route_is_in_the_routes_table(app):
    missing = served_routes(app) - documented_routes()
    assert not missing, f"routes not in docs/protocol.md's routes table: {sorted(missing)}"


def test_the_routes_table_names_only_routes_the_app_serves(app):
    stale = documented_routes() - served_routes(app)
    assert not stale, f"docs/protocol.md lists routes the app does not serve: {sorted(stale)}"


def test_every_route_has_a_section_or_a_pointer_to_one():
    text = PROTOCOL.read_text(encoding="utf-8")
    for row in table_rows(section("### Routes")):
        pointer = row[2].strip('"')
        if pointer not in ("—", "below"):
            assert re.search(rf"^#{{2,3}} {re.escape(pointer)}$", text, re.M), f"{row[0]}: no section {pointer!r}"


def test_every_setting_is_in_the_configuration_table():
    missing = set(DEFAULTS) - set(documented_defaults())
    assert not missing, f"config keys not in docs/protocol.md's configuration table: {sorted(missing)}"


def test_the_configuration_table_names_only_settings_the_app_has():
    stale = set(documented_defaults()) - set(DEFAULTS)
    assert not stale, f"docs/protocol.md documents config keys the app does not have: {sorted(stale)}"


def documented_value(cell: str):
    """A default as the table writes it: `text` for a string, else JSON (`[]`, null, 4, `{...}`)."""
    inner = cell.strip("`")
    try:
        return json.loads(inner)
    except ValueError:
        return inner


@pytest.mark.parametrize("key", list(DEFAULTS))
def test_each_documented_default_is_the_codes(key):
    cell = documented_defaults().get(key)
    assert cell is not None, f"{key} is not documented"
    assert documented_value(cell) == DEFAULTS[key], f"{key}: docs say {cell}, the code has {DEFAULTS[key]!r}"


def test_every_experiment_is_in_the_experiments_table_with_its_parameters():
    rows = {row[0].strip("`"): row[1] for row in table_rows(section("### Experiments API")) if row[0].startswith("`")}
    assert set(rows) == set(EXPERIMENTS), "docs/protocol.md's experiments table and serving_experiments/registry.py"
    for name, exp in EXPERIMENTS.items():
        for field, p in exp.params.items():
            assert f"`{field}` ({p.default}, {p.lo}–{p.hi})" in rows[name], f"{name}: {field} as the code has it"
