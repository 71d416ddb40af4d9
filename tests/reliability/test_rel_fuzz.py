"""Case 25: protocol fuzz. Hypothesis writes `generate` and `cancel` frames with random JSON in
every field (and valid values mixed in, to reach deeper checks); over one live socket, each frame
must get an answer, every error must use a code and field the protocol documents, and the server
must stay healthy with no traceback in its log."""

from __future__ import annotations

import itertools
import json
import re
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvscope_testkit import WAIT_S, Client, LogCursor, terminals

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented_error_codes() -> set[str]:
    """The codes in the `error` event's table of docs/protocol.md."""
    section = PROTOCOL.read_text().split("### `error`", 1)[1].split("\n## ", 1)[0]
    return {code for row in re.findall(r"^\| (`[^|]+) \|", section, re.M) for code in re.findall(r"`(\w+)`", row)}


def documented_fields() -> set[str]:
    """The `generate` field names in docs/protocol.md (their first part: `sampling.top_p` → `sampling`)."""
    section = PROTOCOL.read_text().split("### `generate`", 1)[1].split("### ", 1)[0]
    names = re.findall(r"^\| `([\w.]+)` \|", section, re.M)
    return {name.split(".")[0] for name in names} | {"type"}


CODES = documented_error_codes()
FIELD_ROOTS = documented_fields()


def text(**kwargs):
    """Text without lone surrogates: those get a strategy of their own, so they stay rare."""
    return st.text(st.characters(exclude_categories=["Cs"]), **kwargs)


json_scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | text(max_size=40)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
lone_surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)


def field(valid, *odd):
    """Usually (9 in 10) a plausible value, so later checks are reached too; else any JSON at all.
    (`one_of` would not do: Hypothesis does not pick its branches evenly.)"""
    odd = st.one_of(json_values, *odd)
    return st.sampled_from(range(10)).flatmap(lambda roll: odd if roll == 0 else valid)


messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": field(st.sampled_from(["user", "user", "system", "assistant", "retrieved"])),
            "content": field(text(max_size=120)),
        }
    ),
    max_size=3,
)
messages = field(messages.map(lambda ms: ms + [{"role": "user", "content": "Hi"}]), messages)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "temperature": field(st.floats(0, 2)),
        "top_k": field(st.none() | st.integers(1, 1000)),
        "top_p": field(st.floats(0, 1)),
        "seed": field(st.none() | st.integers(0, 2**31 - 1)),
    },
)
generate_fields = st.fixed_dictionaries(
    {
        "type": field(st.just("generate")).filter(lambda v: v != "cancel"),
        "messages": messages,
    },
    optional={
        "max_new_tokens": field(st.integers(-2, 8)),
        "sampling": field(sampling),
        "stop": field(st.lists(text(min_size=1, max_size=8), max_size=4), st.lists(text(max_size=70), max_size=6)),
        "delivery": field(st.sampled_from(["stream", "buffered"])),
        "kv_cache": field(st.booleans()),
        "prefill_chunk": field(st.integers(0, 64)),
        "overflow": field(st.sampled_from(["reject", "truncate_history", "shrink_output"])),
        "timeout_s": field(st.floats(0, 301)),
        "unnamed": json_values,
        "lone_surrogate": field(st.none(), lone_surrogates),  # rare: a frame holding one is refused whole
    },
)
frames = st.tuples(
    st.sampled_from(["generate", "generate", "generate", "cancel"]),
    field(st.none()),  # None: a fresh valid request id
    generate_fields,
)

counter = itertools.count()


def check_error(error: dict, frame: dict) -> None:
    assert error["code"] in CODES, f"undocumented error code {error['code']!r}: {error}"
    assert isinstance(error["message"], str) and error["message"]
    if error["code"] == "invalid_request":
        root = (error["field"] or "").split(".")[0].split("[")[0]
        unknown = {name for name in frame if name not in FIELD_ROOTS | {"request_id"}}  # refused by name
        assert root in FIELD_ROOTS or error["field"] in unknown, f"undocumented field {error['field']!r}: {error}"


def describe(end: dict) -> str:
    if end["type"] != "error":
        return end["type"]
    root = (end["field"] or "").split("[")[0].split(".")[0]
    return f"{end['code']} ({root})" if root else end["code"]


def exchange(client: Client, frame: dict) -> list[dict]:
    """Send one fuzzed frame and a sync probe after it; return what answered the frame. A request
    that was accepted is cancelled and read to its terminal event."""
    n = next(counter)
    rid = frame.get("request_id")
    tracked = rid if isinstance(rid, str) else None
    before_null = len(client.events[None])
    client.send(json.dumps(frame))  # NaN/Infinity literals and \\ud800 escapes pass as a sloppy client would send them
    probe = f"sync-{n}"
    client.send(json.dumps({"type": probe}))
    client.wait(None, lambda evs: any(probe in e["message"] for e in evs[before_null:]))
    answers = [e for e in client.events[None][before_null:] if probe not in e["message"]]
    if tracked is not None and frame.get("type") == "generate" and not answers:
        own = client.wait(tracked, lambda evs: bool(evs))
        if own[0]["type"] == "accepted":
            client.cancel(tracked)
        client.wait(tracked)
        answers += client.events.pop(tracked)
    return answers


@pytest.fixture(scope="module")
def fuzz_client(fake_server):
    client = Client(fake_server)
    yield client
    client.close()


@pytest.mark.parametrize("examples", [150, pytest.param(1500, marks=pytest.mark.full)])
def test_25_random_json_in_every_field_gets_only_documented_errors(examples, fake_server, fuzz_client, figures):
    log = LogCursor(fake_server)
    tally: dict[str, int] = {}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frames)
    def one(example):
        kind, weird_id, fields = example
        rid = f"z{next(counter)}" if weird_id is None else weird_id
        frame = {**fields, "type": fields["type"] if kind == "generate" else "cancel", "request_id": rid}
        answers = exchange(fuzz_client, frame)
        for event in answers:
            if event["type"] == "error":
                check_error(event, frame)
        ends = terminals(answers)
        assert len(ends) <= 1, answers
        outcome = describe(ends[0]) if ends else "no answer (cancel of nothing in flight)"
        tally[outcome] = tally.get(outcome, 0) + 1

    one()
    with urllib.request.urlopen(fake_server.url + "/healthz", timeout=WAIT_S) as r:
        assert json.load(r)["ok"] is True
    assert log.tracebacks() == []
    figures[f"25-{examples}"] = {
        "examples": examples,
        "outcomes": dict(sorted(tally.items())),
        "documented_codes": sorted(CODES),
        "crashes": 0,
        "hangs": 0,
    }
