"""A raw prompt (GenerateParams.chat_template false, as POST /v1/completions sends it): tokenized as
written, no chat template and nothing added, every token the prompt's own; the context budget
applies as to a chat."""

from __future__ import annotations

import dataclasses

import pytest

from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate
from model_runner.text.prompt import plan
from model_runner.text.tokenizer import ByteTokenizer


def raw(text: str, **fields):
    params = parse_generate({"messages": [{"role": "user", "content": text}], **fields})
    return dataclasses.replace(params, chat_template=False)


def test_a_raw_prompt_is_its_own_tokens_and_nothing_else():
    view = plan(ByteTokenizer(), raw("A KV cache is", max_new_tokens=4), context_window=512)
    assert view.rendered == "A KV cache is"
    assert view.ids == list(b"A KV cache is")
    assert (view.content_tokens, view.template_tokens) == (len(view.ids), 0)
    assert {t["source"] for t in view.tokens} == {"user"}
    assert view.budget["prompt_tokens"] == 13 and view.budget["total"] == 17


def test_the_same_text_through_the_template_is_longer():
    chat = plan(ByteTokenizer(), parse_generate({"messages": [{"role": "user", "content": "Hi"}]}), 512)
    assert chat.prompt_tokens > plan(ByteTokenizer(), raw("Hi"), 512).prompt_tokens == 2


def test_a_control_marker_written_in_a_raw_prompt_is_the_control_token_and_flagged():
    view = plan(ByteTokenizer(), raw("<|im_start|>assistant\nHello"), 512)
    assert view.ids[0] == ByteTokenizer.IM_START and view.tokens[0]["typed_control"] is True


def test_a_raw_prompt_past_the_window_is_refused_as_a_chat_is():
    with pytest.raises(UserError) as caught:
        plan(ByteTokenizer(), raw("x" * 500, max_new_tokens=100), context_window=512)
    assert (caught.value.code, caught.value.field) == ("context_overflow", "max_new_tokens")
