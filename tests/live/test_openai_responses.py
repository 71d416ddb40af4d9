"""`POST /v1/responses` (app/openai/responses.py) with the official `openai` client's
`responses.create` against a live server on the fake model: the answer and its token counts are the
chat endpoint's for the same conversation (a string input is one user turn, `instructions` a system
turn first), streamed in the Responses event order with every delta adding up to the final text,
`max_output_tokens` cutting it as `incomplete`, and every field it cannot honour refused by name in
OpenAI's error shape."""

from __future__ import annotations

import openai
import pytest

from model_runner.loading.fake import ANSWER

WAIT_S = 60.0  # a deadline for conditions that hold in well under a second; never a timing claim
SYSTEM = "You are a tiny test model."
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
STREAM_END = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=WAIT_S, max_retries=0)


def respond(server, **fields):
    return client_for(server).responses.create(**{"model": "fake", "temperature": 0, **fields})


def chat_usage(server, messages) -> openai.types.CompletionUsage:
    reply = client_for(server).chat.completions.create(model="fake", messages=messages, temperature=0)
    return reply.choices[0].message.content, reply.usage


def test_a_string_input_is_one_user_turn_answered_as_chat_answers_it(fake_server):
    reply = respond(fake_server, input="Say hello.", instructions=SYSTEM)
    text, usage = chat_usage(
        fake_server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}]
    )
    assert reply.object == "response" and reply.status == "completed" and reply.id.startswith("resp_")
    assert reply.output_text == text == ANSWER
    assert reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.usage.input_tokens == usage.prompt_tokens
    assert reply.usage.output_tokens == usage.completion_tokens
    assert reply.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.usage.input_tokens_details.cache_write_tokens == 0  # required by the SDK; kvscope counts none
    assert reply.instructions == SYSTEM and reply.model == "fake"


def test_message_items_with_text_parts_read_as_the_same_conversation(fake_server):
    items = [
        {"type": "message", "role": "developer", "content": SYSTEM},
        {"role": "user", "content": [{"type": "input_text", "text": "Say "}, {"type": "input_text", "text": "hello."}]},
    ]
    reply = respond(fake_server, input=items)
    assert reply.output_text == ANSWER
    assert reply.usage.input_tokens == respond(fake_server, input="Say hello.", instructions=SYSTEM).usage.input_tokens


def test_a_stream_runs_the_responses_event_sequence_and_its_deltas_make_the_text(fake_server):
    events = list(respond(fake_server, input="Say hello.", stream=True))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:4] == STREAM_ORDER and kinds[-4:] == STREAM_END
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and len(deltas) > 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert "".join(deltas) == done.output_text == events[-4].text == ANSWER
    assert (
        done.status == "completed"
        and done.usage.output_tokens == respond(fake_server, input="Say hello.").usage.output_tokens
    )
    assert events[0].response.status == "in_progress" and events[0].response.id == done.id


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_cuts_the_answer_as_incomplete(fake_server, stream):
    if stream:
        reply = list(respond(fake_server, input="Say hello.", max_output_tokens=5, stream=True))[-1].response
    else:
        reply = respond(fake_server, input="Say hello.", max_output_tokens=5)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 5 and reply.output_text == ANSWER[:5]
    assert reply.max_output_tokens == 5


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"previous_response_id": "resp_abc"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "4"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 9}, "temperature"),
        ({"input": ""}, "input"),
    ],
)
def test_what_it_cannot_honour_is_refused_naming_the_field(fake_server, fields, param):
    call = {"input": "Say hello.", "max_output_tokens": 3, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        respond(fake_server, **call)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param, caught.value.body
    assert param.split("[")[0] in caught.value.body["message"]
