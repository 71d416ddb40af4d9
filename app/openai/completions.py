"""`POST /v1/completions`, OpenAI's legacy text completion, both ways: the request → kvscope `generate`
requests whose prompt is the raw text or the token ids as sent (no chat template), one per prompt and
choice, and their engine events → a `text_completion` or its stream (docs/protocol.md).

A prompt is a string, a list of strings, a list of token ids or a list of such lists; each prompt's
choices come in order (`index` = prompt × n + choice). `echo` puts the prompt before the answer and,
with `logprobs`, the prompt's own token logprobs from its one prefill (the first null, as OpenAI's
and vLLM's); `max_tokens: 0` with `echo` returns the prompt alone (lm-eval's loglikelihood)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app.openai import request_fields as rf
from app.openai import structured
from app.openai.fanout import with_seed
from app.openai.shapes import TokenNames, check_model, finish_reason, finished_events, logprob, usage_of
from app.openai.streaming import sse_choices
from model_runner.protocol.errors import UserError
from model_runner.protocol.events import Event, Finished, Token
from model_runner.protocol.fields import check_bool, check_int, is_int, json_repr
from model_runner.protocol.request import GenerateParams, parse_generate

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for this endpoint
MAX_PROMPTS = rf.MAX_REQUESTS
KNOWN_FIELDS = (*rf.SAMPLING_FIELDS, *structured.FIELDS, "prompt", "max_tokens", "logprobs", "echo", "best_of")
# parse_generate's field names for the one message → `prompt`, the field the client sent.
PROMPT_FIELDS = {"messages": "prompt", "messages[0]": "prompt", "messages[0].content": "prompt", "prompt_ids": "prompt"}


@dataclass(frozen=True)
class Prompt:
    text: str  # as sent, or the token ids' text
    ids: tuple[int, ...] = ()  # the token ids as sent; empty for a text prompt


@dataclass(frozen=True)
class CompletionCall:
    """A parsed completion request: one engine request per prompt and generated choice."""

    prompts: list[Prompt]
    params: list[GenerateParams]  # prompt-major: prompt p's generated choices are p × best_of …
    n: int
    best_of: int
    top: int | None  # logprobs alternatives, or None
    echo: bool
    echo_only: bool  # max_tokens 0 with echo: the prompt alone, nothing generated is returned
    stream: bool
    include_usage: bool
    continuous_usage: bool

    @property
    def prompt_of(self) -> list[int]:
        return [i // self.best_of for i in range(len(self.params))]


# ---- the request -------------------------------------------------------------------------------


def _token_ids(raw: list, where: str, vocab: int | None) -> tuple[int, ...]:
    if not raw:
        raise UserError(f"`{where}` must hold at least one token id", field="prompt")
    for token in raw:
        if not is_int(token) or token < 0 or (vocab is not None and token >= vocab):
            limit = f"between 0 and {vocab - 1}" if vocab is not None else "0 or more"
            raise UserError(f"`{where}` token ids must be integers {limit}, got {json_repr(token)}", field="prompt")
    return tuple(raw)


def prompts(raw: Any, tokenizer, vocab: int | None) -> list[Prompt]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise UserError(
            "`prompt` must be a string, a list of strings, a list of token ids or a list of such lists",
            field="prompt",
        )
    if all(is_int(t) for t in raw):  # one prompt as token ids
        raw = [raw]
    if len(raw) > MAX_PROMPTS:
        raise UserError(f"`prompt` may hold at most {MAX_PROMPTS} prompts, got {len(raw)}", field="prompt")
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            if not item.strip():
                raise UserError(f"`prompt[{i}]` must hold some text", field="prompt")
            out.append(Prompt(item))
        elif isinstance(item, list):
            if tokenizer is None:
                raise UserError("token-id prompts need the built-in engine's tokenizer", field="prompt")
            ids = _token_ids(item, f"prompt[{i}]", vocab)
            text = b"".join(tokenizer.token_bytes(t) for t in ids).decode("utf-8", errors="replace")
            out.append(Prompt(text, ids))
        else:
            raise UserError(
                f"`prompt[{i}]` must be a string or a list of token ids, got {json_repr(item)}", field="prompt"
            )
    return out


def logprobs_option(body: dict) -> int | None:
    """How many top alternatives per token to return (0–20), or None when `logprobs` is absent."""
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    return check_int("logprobs", value, 0, rf.MAX_TOP_LOGPROBS)


def _params(body: dict, prompt: Prompt, model: Any, top: int | None, echo: bool, echo_only: bool) -> GenerateParams:
    # The message holds the text (shown in the lab, the feed); token ids run as sent. A blank text from
    # token ids (a newline) still needs content for parse_generate's check: the ids are what runs.
    content = prompt.text if prompt.text.strip() or not prompt.ids else prompt.text + "\u200b"
    max_tokens = 1 if echo_only else body.get("max_tokens")  # the engine always chooses one token
    payload: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        **rf.payload(body, max_tokens, DEFAULT_MAX_TOKENS, model.vocab),
        "candidates": top or 0,
    }
    if prompt.ids:
        payload["prompt_ids"] = list(prompt.ids)
    if echo and top is not None:
        payload["prompt_logprobs"] = top
    return replace(parse_generate(payload, rf.limits(model.context)), chat_template=False)


def parse_completion(body: Any, ids: list[str], model: Any) -> CompletionCall:
    """The completion request as engine requests; UserError naming the OpenAI field."""
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object", field=None)
    try:
        rf.check_neutral(body, KNOWN_FIELDS)
        check_model(body, ids)
        top = logprobs_option(body)
        echo = check_bool("echo", False if body.get("echo") is None else body["echo"])
        max_tokens = body.get("max_tokens")
        echo_only = echo and max_tokens == 0
        if max_tokens == 0 and not echo:
            raise UserError("`max_tokens` may be 0 only with `echo` (the prompt alone)", field="max_tokens")
        stream, include_usage, continuous = rf.stream_options(body)
        n, best_of = rf.choices_count(body, stream)
        sent = prompts(body.get("prompt"), model.tokenizer, model.vocab)
        constraint = structured.constraint_of(body)
        if len(sent) * best_of > rf.MAX_REQUESTS:
            raise UserError(
                f"{len(sent)} prompts × {best_of} choices = {len(sent) * best_of} requests; at most "
                f"{rf.MAX_REQUESTS} in one call",
                field="n" if best_of > 1 else "prompt",
            )
        params = [
            with_seed(replace(_params(body, prompt, model, top, echo, echo_only), constraint=constraint), choice)
            for prompt in sent
            for choice in range(best_of)
        ]
    except UserError as exc:
        raise rf.rename_field(exc, {"max_new_tokens": "max_tokens", **PROMPT_FIELDS}) from None
    return CompletionCall(sent, params, n, best_of, top, echo, echo_only, stream, include_usage, continuous)


# ---- the answer --------------------------------------------------------------------------------


class LegacyLogprobs:
    """OpenAI's legacy logprobs object, built token by token: each token's name, its logprob, the `top`
    likeliest alternatives (with the token itself always among them, as OpenAI's), and its offset."""

    def __init__(self, top: int, names: TokenNames, offset: int = 0):
        self.top, self.names, self.offset = top, names, offset
        self.out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add(self, name: str, chosen: float | None, alternatives: dict[str, float] | None) -> None:
        self.out["tokens"].append(name)
        self.out["token_logprobs"].append(chosen)
        self.out["top_logprobs"].append(alternatives)
        self.out["text_offset"].append(self.offset)
        self.offset += len(name)

    def add_prompt(self, ids: list[int], scored: list | None) -> None:
        """The prompt's tokens: the first has no logprob (nothing came before it)."""
        for position, token_id in enumerate(ids):
            entry = scored[position] if scored else None
            name = self.names.name(token_id)
            if entry is None:
                self.add(name, None, None)
                continue
            chosen, ranked = entry
            alternatives = {self.names.name(i): max(lp, -9999.0) for i, lp in ranked[: self.top]}
            alternatives.setdefault(name, max(chosen, -9999.0))
            self.add(name, max(chosen, -9999.0), alternatives)

    def add_token(self, token: Token) -> None:
        name = self.names.of(token)
        alternatives = {self.names.name(c.id, c.text): logprob(c.prob) for c in token.candidates[: self.top]}
        alternatives.setdefault(name, logprob(token.prob))
        self.add(name, logprob(token.prob), alternatives)


def mean_logprob(events: list[Event]) -> float:
    """A choice's mean token logprob: best_of keeps the highest (OpenAI's "highest log probability per token")."""
    tokens = [logprob(e.prob) for e in events if isinstance(e, Token)]
    return sum(tokens) / len(tokens) if tokens else float("-inf")


def _choice(index: int, text: str, finish: str | None, logprobs: dict | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _object(rid: str, served: str, choices: list[dict]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": served, "choices": choices}


def _answer(call: CompletionCall, prompt: Prompt, events: list[Event], handle, names: TokenNames):
    """(text, finish reason, logprobs, completion tokens) of one finished choice."""
    _, finished = finished_events(events)
    tokens = [] if call.echo_only else [e for e in events if isinstance(e, Token)]
    text = (prompt.text if call.echo else "") + ("" if call.echo_only else finished.text)
    logprobs = None
    if call.top is not None:
        built = LegacyLogprobs(call.top, names)
        if call.echo:
            seq = handle.sequence
            built.add_prompt(seq.prompt_ids, seq.prompt_logprobs)
        for token in tokens:
            built.add_token(token)
        logprobs = built.out
    finish = "length" if call.echo_only else finish_reason(finished)
    return text, finish, logprobs, 0 if call.echo_only else finished.tokens


def completion(rid: str, served: str, runs: list[list[Event]], handles: list, call: CompletionCall, names: TokenNames):
    """The `text_completion` object: per prompt, its `n` best choices of `best_of` (all when equal)."""
    choices, prompt_tokens, generated = [], 0, 0
    for p, prompt in enumerate(call.prompts):
        mine = list(range(p * call.best_of, (p + 1) * call.best_of))
        for i in mine:
            finished_events(runs[i])  # an engine error in any choice answers the call with it
        if call.best_of > call.n:
            mine = sorted(mine, key=lambda i: mean_logprob(runs[i]), reverse=True)[: call.n]
        accepted, _ = finished_events(runs[mine[0]])
        prompt_tokens += accepted.prompt_tokens if accepted is not None else 0
        for i in mine:
            text, finish, logprobs, count = _answer(call, prompt, runs[i], handles[i], names)
            generated += count
            choices.append(_choice(len(choices), text, finish, logprobs))
    return {**_object(rid, served, choices), "usage": usage_of(prompt_tokens, generated)}


def chunks(
    rid: str, served: str, events: Iterator[tuple[int, Event]], handles: list, call: CompletionCall, names: TokenNames
) -> Iterator[str]:
    """Server-sent `text_completion` objects for the choices' merged engine events (n = best_of here)."""
    offsets = [0] * len(call.params)  # where each choice's next token starts in its text
    echoed = [False] * len(call.params)

    def echo_prefix(index: int) -> tuple[str, dict | None]:
        """The prompt (and its logprobs) before a choice's first piece, once."""
        if not call.echo or echoed[index]:
            return "", None
        echoed[index] = True
        prompt = call.prompts[call.prompt_of[index]]
        built = LegacyLogprobs(call.top or 0, names) if call.top is not None else None
        if built is not None:
            seq = handles[index].sequence
            built.add_prompt(seq.prompt_ids, seq.prompt_logprobs)
            offsets[index] = built.offset
        return prompt.text, built.out if built is not None else None

    def token_object(index: int, token: Token):
        if call.echo_only or (not token.text and call.top is None and not (call.echo and not echoed[index])):
            return None
        text, logprobs = echo_prefix(index)
        if call.top is not None:
            built = LegacyLogprobs(call.top, names, offsets[index])
            if logprobs is not None:
                built.out = logprobs
            built.add_token(token)
            offsets[index], logprobs = built.offset, built.out
        return _object(rid, served, [_choice(index, text + token.text, None, logprobs)])

    def finish_object(index: int, finished: Finished):
        text, logprobs = echo_prefix(index)
        finish = "length" if call.echo_only else finish_reason(finished)
        return _object(rid, served, [_choice(index, text, finish, logprobs)])

    yield from sse_choices(
        events,
        call.prompt_of,
        token_object,
        finish_object,
        _object(rid, served, []) if call.include_usage else None,
        continuous=call.continuous_usage,
        counts=lambda finished: 0 if call.echo_only else finished.tokens,
    )
