"""A request's fields as the server reads them: an unknown field (a typo, a field of another API)
is refused naming it and the field meant, over the socket's frames and the HTTP prompt preview
alike; every documented field is accepted; docs/protocol.md documents the refusal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app import create_app
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # scripts/ is importable from the checkout's root, as the scripts themselves run
from scripts.protocol_examples import GENERATE, REQUEST_ID  # noqa: E402 (the documented generate request)

PROTOCOL = ROOT / "docs" / "protocol.md"
HELLO = [{"role": "user", "content": "Tell me about caches."}]


@pytest.mark.parametrize(
    "payload, field, hint",
    [
        ({"messages": HELLO, "max_new_token": 500}, "max_new_token", "max_new_tokens"),
        ({"messages": HELLO, "sampling": {"temprature": 1.0}}, "sampling.temprature", "temperature"),
        ({"messages": [{"role": "user", "content": "Hi", "name": "ann"}]}, "messages[0].name", "role, content"),
        ({"messages": HELLO, "colour": "blue"}, "colour", "max_new_tokens"),
    ],
)
def test_an_unknown_field_is_refused_naming_it(payload, field, hint):
    with pytest.raises(UserError) as refused:
        parse_generate(payload)
    assert refused.value.code == "invalid_request" and refused.value.field == field
    assert field in refused.value.message and hint in refused.value.message


def test_the_frames_own_fields_and_every_documented_one_are_accepted():
    frame = {"type": "generate", "request_id": REQUEST_ID, **GENERATE}  # docs/protocol.md's example, every field
    assert parse_generate(frame).max_new_tokens == GENERATE["max_new_tokens"]


def test_the_http_prompt_preview_refuses_an_unknown_field():
    engine = Engine(EngineConfig(model="fake"), loaded=load("fake"))
    client = create_app({"TESTING": True, "ENGINE": engine}).test_client()
    answer = client.post("/api/prompt", json={"messages": HELLO, "max_new_token": 5})
    assert answer.status_code == 400 and answer.get_json()["field"] == "max_new_token"
    assert client.post("/api/prompt", json={"messages": HELLO, "max_new_tokens": 5}).status_code == 200


def test_protocol_doc_documents_the_refusal():
    text = PROTOCOL.read_text()
    assert "Fields the protocol does not name are ignored" not in text
    section = text.split("### `generate`", 1)[1].split("### ", 1)[0]
    assert "unknown field" in section and "`max_new_token`" in section
