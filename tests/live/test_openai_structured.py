"""Structured outputs as the official `openai` client asks for them, against a live server on the fake
model: `chat.completions.parse` with a Pydantic model (the SDK sends a strict json_schema and parses
the answer back into the model), the same streamed, `responses.create` with `text.format`, and
`responses.parse`. The fake model steers towards its scripted text, so only the mask makes these parse."""

from __future__ import annotations

import json
from typing import Literal

import openai
from pydantic import BaseModel

WAIT_S = 60.0  # a deadline for conditions that hold in well under a second; never a timing claim
HELLO = [{"role": "user", "content": "Say hello."}]


class Pet(BaseModel):
    ok: bool
    pet: Literal["cat", "dog"]


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=WAIT_S, max_retries=0)


def test_chat_completions_parse_returns_the_pydantic_model(fake_server):
    reply = client_for(fake_server).chat.completions.parse(
        model="fake", messages=HELLO, response_format=Pet, temperature=0, max_tokens=60
    )
    message = reply.choices[0].message
    assert isinstance(message.parsed, Pet) and message.parsed.pet in ("cat", "dog")
    assert reply.choices[0].finish_reason == "stop"


def test_a_streamed_parse_ends_with_the_parsed_model(fake_server):
    with client_for(fake_server).chat.completions.stream(
        model="fake", messages=HELLO, response_format=Pet, temperature=0, max_tokens=60
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Pet)


def test_responses_create_with_a_json_schema_text_format_answers_json(fake_server):
    schema = Pet.model_json_schema() | {"additionalProperties": False}
    reply = client_for(fake_server).responses.create(
        model="fake",
        input="Say hello.",
        temperature=0,
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "pet", "schema": schema, "strict": True}},
    )
    assert reply.status == "completed" and json.loads(reply.output_text)["pet"] in ("cat", "dog")
    assert reply.text.format.type == "json_schema"


def test_responses_parse_returns_the_pydantic_model(fake_server):
    reply = client_for(fake_server).responses.parse(
        model="fake", input="Say hello.", text_format=Pet, temperature=0, max_output_tokens=60
    )
    assert isinstance(reply.output_parsed, Pet)


def test_a_schema_xgrammar_refuses_is_a_400_naming_the_field(fake_server):
    try:
        client_for(fake_server).chat.completions.create(
            model="fake",
            messages=HELLO,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )
    except openai.BadRequestError as exc:
        assert exc.body["param"] == "response_format.json_schema.schema"
    else:
        raise AssertionError("a schema xgrammar refuses was answered")
