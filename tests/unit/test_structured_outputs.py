"""Structured outputs on the fake model, through the API and the engine: `response_format`
(json_object, json_schema) and vLLM's `structured_outputs` (choice, regex, json, grammar) on chat and
completions, streamed or not, several prompts and choices batched in one call, every answer matching
its constraint and ending `stop` where the grammar ends; each token event of a constrained request
carries the mask its step applied (how many tokens it allowed, whether the model's first choice was
one), an unconstrained one none; what xgrammar refuses is a 400 naming the field. The fake model
steers towards its scripted answer, so the mask, not the model, is what makes these answers match."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from app import create_app
from model_runner.protocol.constraint import Constraint
from model_runner.protocol.request import parse_generate

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "pet": {"enum": ["cat", "dog"]}},
    "required": ["ok", "pet"],
    "additionalProperties": False,
}
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine("fake")


@pytest.fixture(scope="module")
def client(engine):
    return create_app({"TESTING": True, "ENGINE": engine}).test_client()


def chat(client, **fields):
    return client.post("/v1/chat/completions", json={"messages": HELLO, "temperature": 0, "max_tokens": 80, **fields})


def complete(client, **fields):
    return client.post("/v1/completions", json={"prompt": "Say hello.", "temperature": 0, "max_tokens": 80, **fields})


def streamed_texts(response, key) -> dict[int, str]:
    texts: dict[int, str] = {}
    for line in response.get_data(as_text=True).splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + (key(choice) or "")
    return texts


def test_a_json_schema_answer_parses_and_validates(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    body = chat(client, response_format=fmt).get_json()
    value = json.loads(body["choices"][0]["message"]["content"])
    assert isinstance(value["ok"], bool) and value["pet"] in ("cat", "dog") and set(value) == {"ok", "pet"}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_json_schema_answer_parses_and_its_object_opens_the_stream(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
    text = streamed_texts(chat(client, response_format=fmt, stream=True), lambda c: c["delta"].get("content"))[0]
    assert text.startswith('{"ok": ') and json.loads(text)["pet"] in ("cat", "dog")


def test_json_object_forbids_anything_but_an_object_from_the_first_token(client):
    # The fake model would write its scripted text; the mask turns the answer into an object's key.
    text = chat(client, response_format={"type": "json_object"}, max_tokens=4).get_json()["choices"][0]["message"][
        "content"
    ]
    assert text.startswith('{"')


def test_a_batch_of_prompts_and_choices_each_matches_its_regex(client):
    pattern = r"[a-z]{3}-\d\d"
    body = complete(
        client, prompt=["one", "two", "three"], n=2, temperature=1.0, seed=7, structured_outputs={"regex": pattern}
    ).get_json()
    texts = [c["text"] for c in body["choices"]]
    assert len(texts) == 6 and all(re.fullmatch(pattern, t) for t in texts), texts
    assert {c["finish_reason"] for c in body["choices"]} == {"stop"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_choice_answer_is_one_of_the_choices(client, stream):
    choices = ["yes", "no", "maybe"]
    response = complete(client, structured_outputs={"choice": choices}, stream=stream, n=3, temperature=1.0, seed=1)
    if stream:
        texts = list(streamed_texts(response, lambda c: c.get("text")).values())
    else:
        texts = [c["text"] for c in response.get_json()["choices"]]
    assert len(texts) == 3 and set(texts) <= set(choices)


def test_a_grammar_and_a_json_schema_in_structured_outputs(client):
    grammar = 'root ::= "x=" [0-9] ";"'
    assert re.fullmatch(
        r"x=\d;", chat(client, structured_outputs={"grammar": grammar}).get_json()["choices"][0]["message"]["content"]
    )
    value = json.loads(chat(client, structured_outputs={"json": SCHEMA}).get_json()["choices"][0]["message"]["content"])
    assert value["pet"] in ("cat", "dog")


@pytest.mark.parametrize(
    "call, fields, param",
    [
        (
            chat,
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
        ),
        (complete, {"structured_outputs": {"regex": "(["}}, "structured_outputs.regex"),
        (chat, {"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
        (chat, {"structured_outputs": {"json": {"type": "array", "uniqueItems": True}}}, "structured_outputs.json"),
        (chat, {"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        (chat, {"response_format": {"type": "yaml"}}, "response_format.type"),
        (
            chat,
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
        ),
        (complete, {"structured_outputs": {"regex": "a"}, "ignore_eos": True}, "ignore_eos"),
        (chat, {"structured_outputs": {"regex": "a", "disable_fallback": True}}, "structured_outputs.disable_fallback"),
    ],
)
def test_a_constraint_it_cannot_run_is_a_400_naming_the_field(client, call, fields, param):
    response = call(client, **fields)
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == param, error


def run(engine, params, rid):
    return [e.to_dict() for e in engine.submit(params, rid, label="test")]


def test_each_token_event_says_what_the_mask_allowed(engine):
    plain = parse_generate({"messages": HELLO, "max_new_tokens": 6, "sampling": {"temperature": 0}})
    constrained = dataclasses.replace(plain, constraint=Constraint("choice", json.dumps(["yes", "no"]), "f"))
    tokens = [e for e in run(engine, constrained, "mask") if e["type"] == "token"]
    # The fake model wants its scripted "Hello…": its first choice, "H", is forbidden at the first step.
    assert tokens[0]["mask"] == {"allowed": 2, "first_allowed": False}
    word = "".join(t["text"] for t in tokens)
    assert word in ("yes", "no")
    # y|n, then one letter at a time, then only the two end tokens once the word is complete.
    assert [t["mask"]["allowed"] for t in tokens] == [2] + [1] * (len(word) - 1) + [2]
    assert all(e["mask"] is None for e in run(engine, plain, "free") if e["type"] == "token")


def test_a_preempted_constrained_request_resumes_its_grammar_where_it_stopped(engine_factory):
    # 3 requests of 31 + 81 tokens in a 20-block pool (7 blocks each at the end): one is preempted and
    # recomputes; its matcher keeps its place, so every answer still matches the regex whole.
    from kvscope_testkit import ask, blocks_mb, events_of

    engine = engine_factory("fake", kv_cache_mb=blocks_mb(20))
    pattern = "[a-z]{80}"
    params = dataclasses.replace(
        ask("q", system="s", max_new_tokens=100, sampling={"temperature": 1.0, "seed": 5}),
        constraint=Constraint("regex", pattern, "f"),
    )
    handles = [engine.submit(params, f"p{i}") for i in range(3)]  # all queued before any runs alone
    runs = [events_of(handle) for handle in handles]
    assert any(e["type"] == "preempted" for run in runs for e in run)
    for run in runs:
        assert run[-1]["type"] == "finished" and run[-1]["reason"] == "eos", run[-1]
        assert re.fullmatch(pattern, run[-1]["text"])
