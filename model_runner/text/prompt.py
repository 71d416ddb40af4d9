"""Chat messages → one token sequence via the model's own chat template, with each token's
provenance (template marker, text the template inserted itself, or the message it came from),
and the context-budget decision (reject, truncate history, or shrink the output).

Message text is tokenized as the model's tokenizer does by default: a control marker typed inside a
message (`<|im_start|>`, `<|im_end|>`, …) becomes the real control token. The provenance keeps the
message's role as its source and flags such a token with `typed_control: true`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from model_runner.protocol.errors import ContextOverflow
from model_runner.protocol.request import GenerateParams, Message

# A retrieved passage has no role in most chat templates: it is rendered as a user turn and
# labelled "retrieved" by its provenance.
TEMPLATE_ROLE = {"retrieved": "user"}


@dataclass
class PromptView:
    rendered: str
    ids: list[int]
    tokens: list[dict[str, Any]]
    content_tokens: int
    template_tokens: int
    messages: tuple[Message, ...]
    budget: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rendered": self.rendered,
            "tokens": self.tokens,
            "counts": {"content": self.content_tokens, "template": self.template_tokens, "total": len(self.ids)},
            "budget": self.budget,
        }


def _content_spans(rendered: str, messages: tuple[Message, ...]) -> list[tuple[int, int, int]]:
    """(start, end, message index) of each message's content in the rendered text, found in order."""
    spans, cursor = [], 0
    for index, message in enumerate(messages):
        if not message.content:
            continue
        start = rendered.find(message.content, cursor)
        if start < 0:  # the template rewrote this content; its tokens count as template text
            continue
        spans.append((start, start + len(message.content), index))
        cursor = start + len(message.content)
    return spans


def _char_labels(rendered: str, spans, messages, tokenizer) -> list[tuple[str, int | None]]:
    """A provenance label per character. Template text is split at special markers and newlines:
    a short piece (a role name, punctuation) is structure ("marker"); a piece of several words is
    text the template wrote on its own ("inserted"), like a default system prompt."""
    labels: list[tuple[str, int | None]] = [("marker", None)] * len(rendered)
    for s, e, index in spans:
        labels[s:e] = [(messages[index].role, index)] * (e - s)
    specials = [tokenizer.token_bytes(i).decode("utf-8", "ignore") for i in tokenizer.special_ids]
    splitter = re.compile("|".join([re.escape(t) for t in specials if t] + [r"\n"]))
    pos = 0
    for piece in splitter.split(rendered):
        start, pos = pos, pos + len(piece)
        if len(piece.split()) >= 2 and all(labels[i][1] is None for i in range(start, pos)):
            labels[start:pos] = [("inserted", None)] * (pos - start)
        match = splitter.match(rendered, pos)
        pos = match.end() if match else pos
    return labels


def _source(start: int, end: int, labels) -> tuple[str, int | None]:
    """A token's label: its content label if any character is content, else its first character's."""
    window = labels[start:end] or [("marker", None)]
    for label in window:
        if label[1] is not None:
            return label
    return window[0]


def render(tokenizer, messages: tuple[Message, ...], chat_template: bool = True) -> PromptView:
    """The prompt's tokens with their provenance; without `chat_template` the messages' text is the
    prompt as written (a raw completion: no template, no special tokens added)."""
    chat = [{"role": TEMPLATE_ROLE.get(m.role, m.role), "content": m.content} for m in messages]
    rendered = tokenizer.render_chat(chat) if chat_template else "".join(m.content for m in messages)
    ids, offsets = tokenizer.encode(rendered)
    labels = _char_labels(rendered, _content_spans(rendered, messages), messages, tokenizer)
    tokens, content = [], 0
    for token_id, (start, end) in zip(ids, offsets):
        text = rendered[start:end]
        source, index = _source(start, end, labels)
        content += index is not None
        token = {"id": token_id, "text": text, "start": start, "end": end, "source": source, "message": index}
        if index is not None and token_id in tokenizer.special_ids:
            # A chat-template marker typed inside a message (e.g. "<|im_start|>assistant" in the
            # user's text): the tokenizer reads it as the real control token, as the model's own
            # tokenizer does by default, so a user can forge a turn. Kept, and flagged.
            token["typed_control"] = True
        tokens.append(token)
    return PromptView(rendered, ids, tokens, content, len(ids) - content, messages)


def render_ids(tokenizer, ids: tuple[int, ...], messages: tuple[Message, ...]) -> PromptView:
    """A prompt sent as token ids (GenerateParams.prompt_ids): those ids as sent, never re-tokenized; each
    token's text is its own bytes shown on their own, every token the prompt's (the one message's)."""
    tokens, cursor = [], 0
    for token_id in ids:
        text = tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")
        tokens.append({"id": token_id, "text": text, "start": cursor, "end": cursor + len(text), "source": "user"})
        tokens[-1]["message"] = 0
        cursor += len(text)
    return PromptView(messages[0].content, list(ids), tokens, len(ids), 0, messages)


def _overflow_message(prompt: int, new: int | None, window: int) -> str:
    if new is None:
        return f"the prompt's {prompt:,} tokens leave no room for an answer in the context window of {window:,}"
    return (
        f"prompt {prompt:,} + max_new_tokens {new:,} = {prompt + new:,} > context window {window:,}; "
        "shorten the conversation, lower max_new_tokens, or pick overflow policy "
        "'truncate_history' or 'shrink_output'"
    )


def _length(asked: int | None, prompt: int, window: int) -> int:
    """The answer's length: as asked, else the room the prompt leaves (at least the one token every
    request chooses, so a full window still overflows)."""
    return asked if asked is not None else max(window - prompt, 1)


def _droppable(messages: tuple[Message, ...]) -> int | None:
    """Index of the oldest earlier turn (not a system message, not the final user message)."""
    for i, m in enumerate(messages[:-1]):
        if m.role in ("user", "assistant"):
            return i
    return None


def plan(tokenizer, params: GenerateParams, context_window: int) -> PromptView:
    """Render the prompt and apply the overflow policy; raise UserError when it cannot fit."""
    messages, dropped = params.messages, 0
    if params.prompt_ids:  # token ids as sent (POST /v1/completions): no template, no re-tokenizing
        view = render_ids(tokenizer, params.prompt_ids, messages)
    else:
        view = render(tokenizer, messages, params.chat_template)
    asked = params.max_new_tokens  # None: to the end of the context window (the OpenAI API's default)
    new = _length(asked, view.prompt_tokens, context_window)
    action = "none"
    if view.prompt_tokens + new > context_window:
        if params.overflow == "truncate_history":
            while view.prompt_tokens + new > context_window and (i := _droppable(messages)) is not None:
                messages = messages[:i] + messages[i + 1 :]
                dropped += 1
                view = render(tokenizer, messages, params.chat_template)
                new = _length(asked, view.prompt_tokens, context_window)
            action = "truncated_history" if dropped else "none"
        elif params.overflow == "shrink_output" and view.prompt_tokens < context_window:
            new = context_window - view.prompt_tokens
            action = "shrunk_output"
    if view.prompt_tokens + new > context_window:
        raise ContextOverflow(
            _overflow_message(view.prompt_tokens, None if asked is None else new, context_window),
            prompt_tokens=view.prompt_tokens,
            max_new_tokens=asked,
            context_window=context_window,
            field="max_new_tokens" if asked is not None else "messages",
        )
    view.budget = {
        "policy": params.overflow,
        "action": action,
        "prompt_tokens": view.prompt_tokens,
        "max_new_tokens": new,
        "requested_max_new_tokens": asked,
        "total": view.prompt_tokens + new,
        "context_window": context_window,
        "dropped_messages": dropped,
    }
    return view
