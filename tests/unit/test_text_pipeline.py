"""Detokenizer, stop strings, prompt provenance and the events' documentation, without a model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model_runner import events
from model_runner.request import Message
from model_runner.text.detokenizer import IncrementalDetokenizer, display_text
from model_runner.text.prompt import render
from model_runner.text.stopping import StopChecker
from model_runner.text.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]


def feed_all(text: str) -> list[str]:
    detok = IncrementalDetokenizer(ByteTokenizer())
    return [detok.feed(b) for b in text.encode()]


def test_multibyte_characters_wait_until_complete():
    out = feed_all("a😀é你")
    assert out == ["a", "", "", "", "😀", "", "é", "", "", "你"]


def test_bytes_that_can_never_form_a_character_are_dropped_not_replaced():
    detok = IncrementalDetokenizer(ByteTokenizer())
    out = "".join(detok.feed(b) for b in [0xF0, 0x9F, 0x41, 0x42, 0x43, 0x44])  # broken emoji, then ABCD
    assert "\ufffd" not in out and out.endswith("ABCD")


def test_special_tokens_add_no_text_and_candidates_escape_partial_bytes():
    tok = ByteTokenizer()
    assert IncrementalDetokenizer(tok).feed(ByteTokenizer.IM_END) == ""
    assert display_text(tok, 0xF0) == "\\xf0"


def checker(stop=(), max_new=100):
    return StopChecker(
        eos_ids=frozenset({999}), stop=tuple(stop), max_new_tokens=max_new, prompt_tokens=10, context_window=50
    )


def test_stop_string_prefix_is_held_back_then_released_when_it_cannot_match():
    c = checker(["STOP"])
    assert c.add(1, "ab", 1) == ("ab", None)
    assert c.add(1, "ST", 2) == ("", None)  # could be the start of STOP
    assert c.add(1, "x", 3) == ("STx", None)


def test_stop_string_across_tokens_ends_without_it():
    c = checker(["STOP"])
    pieces = [c.add(1, t, i + 1) for i, t in enumerate(["hi S", "T", "O", "P!"])]
    assert pieces[-1] == ("", "stop_string") or pieces[-1][1] == "stop_string"
    assert "".join(p[0] for p in pieces) == "hi " and c.text == "hi "


def test_finish_reasons_eos_context_full_max_tokens():
    assert checker().add(999, "", 1)[1] == "eos"
    assert checker().add(1, "x", 40)[1] == "context_full"  # 10 prompt + 40 = the window of 50
    assert checker(max_new=3).add(1, "x", 3)[1] == "max_tokens"


def test_provenance_marks_template_inserted_text_and_each_message():
    view = render(ByteTokenizer(), (Message("retrieved", "Doc."), Message("user", "Hi")))
    by_source = {}
    for t in view.tokens:
        by_source.setdefault(t["source"], "")
        by_source[t["source"]] += t["text"]
    assert by_source["inserted"] == ByteTokenizer.DEFAULT_SYSTEM
    assert by_source["retrieved"] == "Doc." and by_source["user"] == "Hi"
    assert "<|im_start|>" in by_source["marker"] and "assistant" in by_source["marker"]
    assert view.content_tokens == len("Doc.") + len("Hi")
    assert view.content_tokens + view.template_tokens == len(view.ids)


def test_every_event_type_is_documented_with_an_example():
    doc = (ROOT / "docs" / "protocol.md").read_text()
    for name in events.EVENT_TYPES:
        assert re.search(rf"^### `{name}`", doc, re.M), f"event `{name}` has no section in docs/protocol.md"
        assert f'"type": "{name}"' in doc, f"event `{name}` has no JSON example in docs/protocol.md"


@pytest.mark.parametrize("cls", list(events.EVENT_TYPES.values()))
def test_events_are_frozen(cls):
    assert cls.__dataclass_params__.frozen
