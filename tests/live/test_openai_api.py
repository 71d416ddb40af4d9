"""The OpenAI-compatible endpoints (app/openai/routes.py) with the official `openai` client against a
live gunicorn server: chat and legacy completions give the same greedy answer and token counts as
the WebSocket protocol, streamed or not, under the model's own id and a `--served-model-name` alias;
an unknown model is openai.NotFoundError; logprobs, field errors in OpenAI's shape, and a stream
closed early cancelling its request; batches of prompts with n choices, the context named in a
length error, models.retrieve, and OpenAI's 404 for an unknown route under /v1."""

from __future__ import annotations

import json

import openai
import pytest
from kvscope_testkit import HELLO, TERMINAL, LogCursor, end_is, generate_frame
from websockets.sync.client import connect

from model_runner.loading.fake import ANSWER

WAIT_S = 60.0  # a deadline for conditions that hold in well under a second; never a timing claim
ALIASES = ("tiny-chat", "kv-alias")  # `kvscope serve --served-model-name tiny-chat kv-alias`
# The fake model's chat template written out by hand: as a raw prompt it must read exactly as the
# chat request HELLO does (ByteTokenizer.render_chat), so it gets the same answer and token count.
HELLO_RAW = (
    "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
    "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
)


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=WAIT_S, max_retries=0)


def chat(server, **fields):
    """chat.completions.create for HELLO with the served model, greedy, unless `fields` say otherwise."""
    return client_for(server).chat.completions.create(
        **{"model": "fake", "messages": HELLO, "temperature": 0, **fields}
    )


def complete(server, **fields):
    """completions.create for HELLO_RAW with the served model, greedy, room for the whole answer,
    unless `fields` say otherwise."""
    return client_for(server).completions.create(
        **{"model": "fake", "prompt": HELLO_RAW, "temperature": 0, "max_tokens": 200, **fields}
    )


@pytest.fixture(scope="module")
def alias_server(live_server):
    return live_server("fake", args=["--served-model-name", *ALIASES])


@pytest.fixture(scope="module")
def ws_answer(fake_server) -> dict:
    """What the WebSocket protocol answers for HELLO greedily: accepted and finished events."""
    with connect(fake_server.ws_url, origin=fake_server.url, open_timeout=WAIT_S, close_timeout=5) as ws:
        ws.send(json.dumps(generate_frame("openai-ref", sampling={"temperature": 0})))
        events = [json.loads(ws.recv(timeout=WAIT_S))]
        while events[-1]["type"] not in TERMINAL:
            events.append(json.loads(ws.recv(timeout=WAIT_S)))
    accepted = next(e for e in events if e["type"] == "accepted")
    return {"accepted": accepted, "finished": events[-1]}


def test_models_lists_the_served_model(fake_server):
    models = client_for(fake_server).models.list()
    assert [m.id for m in models.data] == ["fake"]
    assert models.data[0].owned_by == "kvscope"


def test_models_lists_the_served_names_first_then_the_models_own(alias_server):
    assert [m.id for m in client_for(alias_server).models.list().data] == [*ALIASES, "fake"]


@pytest.mark.parametrize("model", ["fake", *ALIASES])
@pytest.mark.parametrize("stream", [False, True])
def test_chat_answers_under_each_id_and_reports_the_first_served_name(alias_server, model, stream):
    if stream:
        chunks = list(chat(alias_server, model=model, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reported = {c.model for c in chunks}
    else:
        reply = chat(alias_server, model=model)
        text, reported = reply.choices[0].message.content, {reply.model}
    assert text == ANSWER
    assert reported == {ALIASES[0]}


@pytest.mark.parametrize("model", ["fake", *ALIASES])
@pytest.mark.parametrize("stream", [False, True])
def test_completions_answer_under_each_id_and_report_the_first_served_name(alias_server, model, stream):
    if stream:
        chunks = list(complete(alias_server, model=model, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reported = {c.model for c in chunks}
    else:
        reply = complete(alias_server, model=model)
        text, reported = reply.choices[0].text, {reply.model}
    assert text == ANSWER
    assert reported == {ALIASES[0]}


@pytest.mark.parametrize("call", [chat, complete])
def test_an_unknown_model_is_not_found_in_openai_shape(alias_server, call):
    with pytest.raises(openai.NotFoundError) as caught:
        call(alias_server, model="gpt-4o")
    error = caught.value.body
    assert caught.value.status_code == 404
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert all(name in error["message"] for name in (*ALIASES, "fake"))


def test_a_completion_reads_the_raw_prompt_as_chat_reads_its_template(fake_server, ws_answer):
    reply = complete(fake_server)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == ws_answer["finished"]["text"]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == ws_answer["accepted"]["prompt_tokens"]
    assert reply.usage.completion_tokens == ws_answer["finished"]["tokens"]


def test_a_completion_prompt_gets_no_template(fake_server):
    reply = complete(fake_server, prompt=["Say hello."], max_tokens=2)  # a list of one string
    assert reply.usage.prompt_tokens == len(b"Say hello.")  # one token a byte, nothing added
    assert reply.usage.completion_tokens == 2 and reply.choices[0].finish_reason == "length"


def test_a_completion_continues_the_text_it_is_given(fake_server):
    reply = complete(fake_server, prompt=HELLO_RAW + "Hello from", stop=" model")
    assert reply.choices[0].text == " the fake" and reply.choices[0].finish_reason == "stop"


def test_a_streamed_completion_ends_with_its_usage(fake_server, ws_answer):
    chunks = list(complete(fake_server, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ws_answer["finished"]["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ws_answer["finished"]["tokens"]
    assert chunks[-1].usage.prompt_tokens == ws_answer["accepted"]["prompt_tokens"]


def test_completion_logprobs_hold_the_chosen_token_and_at_most_the_asked_alternatives(fake_server):
    reply = complete(fake_server, max_tokens=6, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == reply.usage.completion_tokens
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    for token, chosen, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert chosen <= 0 and top[token] == chosen
        assert 1 <= len(top) <= 3 + 1  # the asked alternatives, and the chosen token always


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": "yes"}, "echo"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt": []}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 5}, "temperature"),
        ({"n": 17}, "n"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"stop": ["x"] * 65}, "stop"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"logit_bias": {"999": 1}}, "logit_bias"),
    ],
)
def test_a_bad_completion_field_is_refused_naming_it(fake_server, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        complete(fake_server, **fields)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert f"`{param}`" in error["message"]


def test_a_completion_matches_the_websocket_answer_and_its_counts(fake_server, ws_answer):
    finished = ws_answer["finished"]
    assert finished["type"] == "finished" and finished["text"] == ANSWER
    reply = chat(fake_server)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == finished["text"]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == ws_answer["accepted"]["prompt_tokens"]
    assert reply.usage.completion_tokens == finished["tokens"]
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_max_tokens_ends_with_length(fake_server):
    reply = chat(fake_server, max_tokens=5)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert ANSWER.startswith(reply.choices[0].message.content)


def test_a_stream_concatenates_to_the_websocket_answer(fake_server, ws_answer):
    stream = chat(fake_server, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ws_answer["finished"]["text"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == ws_answer["accepted"]["prompt_tokens"]
    assert chunks[-1].usage.completion_tokens == ws_answer["finished"]["tokens"]


def test_logprobs_come_with_at_most_the_asked_alternatives(fake_server):
    reply = chat(fake_server, max_tokens=8, logprobs=True, top_logprobs=5)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0
        assert 1 <= len(entry.top_logprobs) <= 5
        assert all(alt.logprob <= 0 for alt in entry.top_logprobs)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the likeliest


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"n": 17}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"stop": ["x"] * 65}, "stop"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)
def test_a_bad_field_is_refused_naming_it(fake_server, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(fake_server, **fields)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"]


def test_a_batch_of_prompts_and_n_choices_come_back_in_order(fake_server):
    reply = complete(fake_server, prompt=["Say hello.", HELLO_RAW], n=2, max_tokens=3)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    alone = [complete(fake_server, prompt=p, max_tokens=1).usage.prompt_tokens for p in ("Say hello.", HELLO_RAW)]
    assert reply.usage.prompt_tokens == sum(alone)  # each prompt counted once, not once a choice


def test_max_tokens_over_the_context_is_refused_naming_both_numbers(fake_server):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(fake_server, max_completion_tokens=100_000)
    error = caught.value.body
    assert error["param"] == "max_completion_tokens"
    assert error["message"].startswith("This model's maximum context length is 512 tokens. However, you requested")


def test_an_unknown_route_under_v1_is_openais_not_found(fake_server):
    with pytest.raises(openai.NotFoundError) as caught:
        client_for(fake_server).get("/nothing", cast_to=dict)
    assert caught.value.body["code"] == "not_found"


def test_a_model_is_retrieved_by_its_id(alias_server):
    assert client_for(alias_server).models.retrieve(ALIASES[1]).id == ALIASES[1]


@pytest.mark.parametrize("call", [chat, complete])
def test_closing_a_stream_early_cancels_the_request_on_the_server(slow_server, call):
    log = LogCursor(slow_server)
    stream = call(slow_server, stream=True)
    rid = None
    for count, chunk in enumerate(stream):
        rid = chunk.id
        if count == 3:
            break
    stream.close()
    end = log.wait_end(rid, timeout=WAIT_S)
    assert end_is(end, "cancelled", cause="disconnect"), end


def test_api_requests_show_in_the_engine_feed_as_api(fake_server):
    with connect(fake_server.ws_url, origin=fake_server.url, open_timeout=WAIT_S, close_timeout=5) as ws:
        ws.send(json.dumps({"type": "subscribe"}))
        assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "engine_snapshot"
        chat(fake_server, max_tokens=3)
        event = json.loads(ws.recv(timeout=WAIT_S))
        while event["type"] != "engine_end":
            event = json.loads(ws.recv(timeout=WAIT_S))
    assert event["label"] == "api" and event["outcome"] == "finished"


def test_a_stop_string_ends_the_answer_with_stop(fake_server):
    reply = chat(fake_server, stop="cache")
    assert reply.choices[0].finish_reason == "stop"
    assert ANSWER.startswith(reply.choices[0].message.content)
    assert len(reply.choices[0].message.content) < ANSWER.index("cache") + len("cache")


def test_a_body_over_the_limit_is_refused_in_openai_shape(fake_server):
    with pytest.raises(openai.APIStatusError) as caught:
        chat(fake_server, messages=[{"role": "user", "content": "x" * 300_000}])
    assert caught.value.status_code == 413
    assert caught.value.body["code"] == "too_large"
