"""The OpenAI request fields (app/openai/request_fields.py, chat.py, completions.py) on the fake model:
standard fields accepted at the values that change nothing and refused, by name, at a value that would;
chat content parts, the developer role and a null assistant turn; tool turns refused saying why; the
limits are the model's (the context, named with the prompt's tokens as vLLM words it), not the lab's."""

from __future__ import annotations

import re

import pytest

from app import create_app
from app.openai.chat import parse_chat
from app.openai.routes import ModelView
from model_runner.protocol.errors import ContextOverflow
from model_runner.protocol.request import parse_generate

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(shared_engine):
    return create_app({"TESTING": True, "ENGINE": shared_engine("fake")}).test_client()


def chat(client, **fields):
    return client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4, "temperature": 0, **fields})


def complete(client, **fields):
    return client.post("/v1/completions", json={"prompt": "Say hello.", "max_tokens": 4, "temperature": 0, **fields})


NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "repetition_penalty": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "min_tokens": 0,
    "ignore_eos": False,
    "logit_bias": {},
    "store": False,
    "metadata": {"who": "test"},
    "parallel_tool_calls": True,
    "tools": [],
    "tool_choice": "none",
    "response_format": {"type": "text"},
    "user": "someone",
    "n": 1,
    "seed": None,
    "stream_options": None,
}


@pytest.mark.parametrize("call", [chat, complete])
def test_neutral_values_of_every_standard_field_give_the_plain_answer(client, call):
    plain = call(client).get_json()
    neutral = call(client, **NEUTRAL).get_json()
    text = "message" if call is chat else "text"
    pick = (lambda c: c["message"]["content"]) if text == "message" else (lambda c: c["text"])
    assert pick(neutral["choices"][0]) == pick(plain["choices"][0])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("structured_outputs", {"regex": "a+", "choice": ["a"]}),  # one constraint at a time
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"),
        ("modalities", ["text", "audio"]),
        ("use_beam_search", True),
    ],
)
def test_a_value_that_would_change_the_answer_is_refused_naming_the_field(client, field, value):
    response = chat(client, **{field: value})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == field and f"`{field}`" in error["message"]


def test_a_misspelt_field_is_still_refused(client):
    response = chat(client, max_token=4)
    assert response.status_code == 400 and response.get_json()["error"]["param"] == "max_token"


def test_text_parts_a_developer_turn_and_a_null_assistant_turn_read_as_their_text(client):
    parts = [
        {"role": "developer", "content": "You are a tiny test model."},
        {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}]},
    ]
    plain = [{"role": "system", "content": "You are a tiny test model."}, {"role": "user", "content": "Say hello."}]
    a = chat(client, messages=parts).get_json()
    b = chat(client, messages=plain).get_json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    turns = [*HI, {"role": "assistant", "content": None}, *HI]
    assert chat(client, messages=turns).status_code == 200


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "42", "tool_call_id": "a"}, "messages[1].role"),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "a"}]}, "messages[1].tool_calls"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages[1].content[0]"),
    ],
)
def test_what_the_template_cannot_show_the_model_is_refused_saying_so(client, message, param):
    response = chat(client, messages=[*HI, message, *HI])
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == param
    if "tool" in param or param.endswith("role"):
        assert "chat template has no tool turns" in error["message"]


def test_max_tokens_over_the_context_names_the_window_the_prompt_and_the_answer(client):
    response = chat(client, max_tokens=100_000)
    error = response.get_json()["error"]
    prompt = chat(client).get_json()["usage"]["prompt_tokens"]
    assert response.status_code == 400 and error["param"] == "max_tokens"
    assert error["message"].startswith(
        f"This model's maximum context length is 512 tokens. However, you requested {prompt + 100_000} tokens "
        f"({prompt} in the messages, 100000 in the completion)."
    )


def test_a_chat_without_max_tokens_asks_no_length_and_gets_the_room_its_prompt_leaves(shared_engine):
    engine = shared_engine("fake")
    model = ModelView(engine.facts.context_window, engine.facts.vocab_size, engine.local.loaded.tokenizer)
    params = parse_chat({"messages": HI}, ["fake"], model).params[0]
    assert params.max_new_tokens is None and params.overflow == "reject"  # no stand-in length, no policy
    budget = engine.describe_prompt(params)["budget"]
    assert budget["requested_max_new_tokens"] is None and budget["action"] == "none"
    assert budget["max_new_tokens"] == 512 - budget["prompt_tokens"]


def test_the_engines_overflow_error_carries_its_counts(shared_engine):
    over = {"messages": [{"role": "user", "content": "x" * 600}], "max_new_tokens": 5}
    with pytest.raises(ContextOverflow) as caught:
        shared_engine("fake").describe_prompt(parse_generate(over))
    error = caught.value
    assert (error.code, error.field, error.max_new_tokens, error.context_window) == (
        "context_overflow",
        "max_new_tokens",
        5,
        512,
    )
    assert error.prompt_tokens > 600 and f"prompt {error.prompt_tokens:,} + max_new_tokens 5" in error.message


def test_a_prompt_that_fills_the_context_without_max_tokens_is_refused_naming_the_messages(client):
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 600}]})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == "messages"
    assert re.search(r"you requested (\d+) tokens \(\1 in the messages, 0 in the completion\)", error["message"])


def test_the_answer_may_use_the_whole_context_left(client):
    prompt = chat(client).get_json()["usage"]["prompt_tokens"]
    assert chat(client, max_tokens=512 - prompt).status_code == 200  # beyond the lab's 128 and 1,024 caps alike
    too_long = complete(client, prompt="x" * 600)
    error = too_long.get_json()["error"]
    assert too_long.status_code == 400 and error["param"] == "prompt" and "600 in your prompt" in error["message"]


def test_a_long_stop_list_is_taken_and_its_cap_is_named(client):
    stops = ["\n", ".", "Question:", "<|im_end|>", "Answer:", "###"]  # lm-eval: a task's stops and the end token
    assert complete(client, stop=stops).status_code == 200
    error = complete(client, stop=["x"] * 65).get_json()["error"]
    assert error["param"] == "stop" and "at most 64" in error["message"]


def test_top_logprobs_go_to_openais_twenty(client):
    reply = chat(client, logprobs=True, top_logprobs=20, max_tokens=2).get_json()
    assert all(len(entry["top_logprobs"]) == 20 for entry in reply["choices"][0]["logprobs"]["content"])
    assert chat(client, logprobs=True, top_logprobs=21).get_json()["error"]["param"] == "top_logprobs"


def test_the_end_token_has_one_name_as_chosen_and_as_alternative(client):
    reply = chat(client, max_tokens=200, logprobs=True, top_logprobs=3).get_json()
    last = reply["choices"][0]["logprobs"]["content"][-1]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert last["token"] == "<|im_end|>" and last["top_logprobs"][0]["token"] == "<|im_end|>"
    completion = complete(
        client, prompt="<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n", max_tokens=200, logprobs=2
    ).get_json()
    logprobs = completion["choices"][0]["logprobs"]
    assert logprobs["tokens"][-1] == "<|im_end|>" and "<|im_end|>" in logprobs["top_logprobs"][-1]
    content = reply["choices"][0]["logprobs"]["content"]
    spelt = b"".join(bytes(entry["bytes"]) for entry in content[:-1])  # a split emoji: its bytes, token by token
    assert spelt.decode() == reply["choices"][0]["message"]["content"]
