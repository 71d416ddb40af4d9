"""The exact request bodies real clients send (tests/data/client_bodies: lm-eval 0.4.13, guidellm 0.8.1,
langchain-openai 1.7.4, the openai SDK 3.57.0, each captured once), replayed against the app on the fake
model under the model name the clients used: every one is answered, in the shape the client reads
(one choice per prompt and `n`, `index` in order, echo's prompt logprobs first null, a stream ending
with its usage and `[DONE]`; a structured answer that parses; the Responses API's object or its event
stream). Bodies with the real model's token ids replay in tests/model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import create_app

BODIES = Path(__file__).resolve().parents[1] / "data" / "client_bodies"
SERVED = "SmolLM2-135M-Instruct"  # the name the clients were pointed at


def recorded() -> list[tuple[str, int, dict]]:
    out = []
    for path in sorted(BODIES.glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["client"] in path.name and doc["version"] in path.name, f"{path.name} names its client and version"
        out += [(path.name, i, r) for i, r in enumerate(doc["requests"])]
    return out


def with_token_ids(body) -> bool:
    prompt = (body or {}).get("prompt")
    return isinstance(prompt, list) and any(isinstance(p, (int, list)) for p in prompt)


REPLAYS = [(name, i, r) for name, i, r in recorded() if not with_token_ids(r["body"])]


@pytest.fixture(scope="module")
def client(shared_engine):
    app = create_app({"TESTING": True, "ENGINE": shared_engine("fake"), "SERVED_MODEL_NAMES": [SERVED]})
    return app.test_client()


def stream_objects(text: str) -> list:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", "a stream ends with [DONE]"
    return [json.loads(line) for line in lines[:-1]]


def prompts_of(body: dict) -> int:
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, list) else 1


def test_every_client_and_what_it_ran_is_recorded():
    names = {name for name, _, _ in recorded()}
    for client in ("lm-eval-0.4.13", "guidellm-0.8.1", "langchain-openai-1.7.4", "openai-3.57.0"):
        assert any(name.startswith(client) for name in names), client
    assert len(REPLAYS) >= 20


@pytest.mark.parametrize(("name", "index", "record"), REPLAYS, ids=[f"{n}#{i}" for n, i, _ in REPLAYS])
def test_a_recorded_request_is_answered_in_the_shape_its_client_reads(client, name, index, record):
    method, path, body = record["method"], record["path"], record["body"]
    response = client.get(path) if method == "GET" else client.post(path, json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    if path == "/health":
        return
    if path.startswith("/v1/models"):
        data = response.get_json()
        assert SERVED in ([m["id"] for m in data["data"]] if "data" in data else [data["id"]])
        return
    if path in ("/tokenize", "/tokenizer_info"):
        data = response.get_json()
        assert ("tokens" in data) if path == "/tokenize" else ("eos_token" in data)
        return
    if path == "/v1/responses":
        check_responses_answer(response, body)
        return
    n = body.get("n") or 1
    expected = prompts_of(body) * n if path == "/v1/completions" else n
    if body.get("stream"):
        objects = stream_objects(response.get_data(as_text=True))
        indices = {c["index"] for o in objects for c in o["choices"]}
        assert indices == set(range(expected))
        finishes = [c["finish_reason"] for o in objects for c in o["choices"] if c["finish_reason"]]
        assert len(finishes) == expected
        if (body.get("stream_options") or {}).get("include_usage"):
            assert objects[-1]["choices"] == [] and objects[-1]["usage"]["completion_tokens"] > 0
        return
    data = response.get_json()
    assert [c["index"] for c in data["choices"]] == list(range(expected))
    if (body.get("response_format") or {}).get("type") == "json_schema":  # the SDK's parse reads it back
        assert all(json.loads(c["message"]["content"]) for c in data["choices"] if c["finish_reason"] == "stop")
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
    if body.get("ignore_eos") and body.get("max_completion_tokens"):
        assert data["usage"]["completion_tokens"] == body["max_completion_tokens"]  # guidellm's fixed length


def check_responses_answer(response, body: dict) -> None:
    """The Responses API's shapes: a stream of typed events from response.created to response.completed
    (no [DONE]), or one `response` object with its usage."""
    if body.get("stream"):
        lines = [line for line in response.get_data(as_text=True).split("\n") if line.startswith("data: ")]
        kinds = [json.loads(line[len("data: ") :])["type"] for line in lines]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
        return
    data = response.get_json()
    assert data["object"] == "response" and data["status"] in ("completed", "incomplete")
    usage = data["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["output_tokens"] > 0
    if (body.get("text") or {}).get("format", {}).get("type") == "json_schema" and data["status"] == "completed":
        assert isinstance(json.loads(data["output"][0]["content"][0]["text"]), dict)  # responses.parse reads it


def test_guidellm_gets_exactly_the_output_length_it_asks_for_in_every_chunk_count(client):
    body = next(r["body"] for n, _, r in REPLAYS if n.startswith("guidellm") and r["method"] == "POST")
    objects = stream_objects(client.post("/v1/chat/completions", json=body).get_data(as_text=True))
    usages = [o["usage"] for o in objects if o.get("usage")]
    assert usages[-1]["completion_tokens"] == body["max_completion_tokens"]  # ignore_eos ran past the end token
    assert [u["completion_tokens"] for u in usages[:-1]] == sorted(u["completion_tokens"] for u in usages[:-1])
