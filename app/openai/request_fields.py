"""The OpenAI request fields both endpoints share, mapped onto kvscope `generate` payloads: the
sampling fields the sampler implements (temperature, top_p, top_k, min_p, penalties, logit_bias,
seed, min_tokens, ignore_eos), the standard fields that cannot apply here accepted at the values
that change nothing (and refused, by name, at any value that would change the answer), the number
of choices, and the limits, which are the model's (its context window, its vocabulary), not the lab's."""

from __future__ import annotations

from typing import Any, Callable

from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import check_int, is_int, json_repr

MAX_CHOICES = 16  # `n` and `best_of`: each choice is one engine request
MAX_REQUESTS = 32  # prompts × choices in one call: half the engine's default queue
MAX_STOPS = 64  # stop strings (lm-eval adds the end token to a task's own stops)
MAX_STOP_CHARS = 512
MAX_MESSAGES = 1000
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat's top_logprobs; vLLM's default max_logprobs
# parse_generate's field names → the OpenAI names a client sent.
PARAM_NAMES = {
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.seed": "seed",
    "sampling.top_k": "top_k",
    "sampling.min_p": "min_p",
    "sampling.frequency_penalty": "frequency_penalty",
    "sampling.presence_penalty": "presence_penalty",
    "sampling.repetition_penalty": "repetition_penalty",
    "sampling.logit_bias": "logit_bias",
    "sampling.logit_bias token id": "logit_bias",
    "min_new_tokens": "min_tokens",
}


def _none_or(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or value in allowed


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _any_of(*types: type) -> Callable[[Any], bool]:
    return lambda value: value is None or isinstance(value, types)


# Standard fields that cannot apply on this server: each accepted where its value changes nothing,
# with what that is, for the error naming it otherwise.
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "user": (_any_of(str), "a string (it is not stored)"),
    "store": (_any_of(bool), "true or false (nothing is stored either way)"),
    "metadata": (_any_of(dict), "an object (it is not stored)"),
    "service_tier": (_any_of(str), "a string (one tier here)"),
    "parallel_tool_calls": (_any_of(bool), "true or false (no tools are called here)"),
    "tools": (_empty, "empty: this server runs no tools, and a tool list changes what the model is asked"),
    "functions": (_empty, "empty: this server runs no functions"),
    "tool_choice": (_none_or("none", "auto"), '"none" or "auto": with no tools the answer is text either way'),
    "function_call": (_none_or("none", "auto"), '"none" or "auto": with no functions the answer is text'),
    "modalities": (lambda v: v is None or v == ["text"], '["text"]: the model answers in text only'),
    "audio": (_empty, "null: the model answers in text only"),
    "prediction": (_empty, "null: no predicted output is used"),
    "reasoning_effort": (_empty, "null: the model has no reasoning setting"),
    "web_search_options": (_empty, "null: this server does not search"),
    "suffix": (lambda v: v is None or v == "", 'null or "": the model does not fill in the middle'),
    "skip_special_tokens": (_none_or(True), "true: end and control tokens add no text"),
    "spaces_between_special_tokens": (_none_or(True), "true"),
    "include_stop_str_in_output": (_none_or(False), "false: a matched stop string is not in the answer"),
    "add_generation_prompt": (_none_or(True), "true: the template opens the assistant's turn"),
    "use_beam_search": (_none_or(False), "false: this server samples, it does not beam-search"),
    "length_penalty": (_none_or(1, 1.0), "1 (no beam search)"),
    "stop_token_ids": (_empty, "empty: stop with `stop` strings (the end token always stops)"),
    "truncate_prompt_tokens": (_empty, "null: a prompt too long for the context is refused, never cut"),
}
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
    "stop",
    "n",
    "stream",
    "stream_options",
    "model",
)


def check_neutral(body: dict, known: tuple[str, ...]) -> None:
    """Every field is one this endpoint reads (`known`) or a standard one at a neutral value; anything
    else is refused by name (a typo never runs silently with the default)."""
    for name, value in body.items():
        if name in known:
            continue
        if name in NEUTRAL:
            accepts, neutral = NEUTRAL[name]
            if not accepts(value):
                raise UserError(
                    f"`{name}` may only be {neutral}; got {json_repr(value)}", field=name, code="not_supported"
                )
            continue
        raise UserError(f"unknown or unsupported field {json_repr(str(name))}", field=str(name)[:100])


def choices_count(body: dict, streams: bool) -> tuple[int, int]:
    """(n, best_of): how many answers to return and how many to generate (best_of ≥ n; a stream can
    return only what it generates)."""
    n = 1 if body.get("n") is None else check_int("n", body["n"], 1, MAX_CHOICES)
    best_of = n if body.get("best_of") is None else check_int("best_of", body["best_of"], 1, MAX_CHOICES)
    if best_of < n:
        raise UserError(f"`best_of` ({best_of}) must be at least `n` ({n})", field="best_of")
    if streams and best_of > n:
        raise UserError("`best_of` greater than `n` cannot stream: the best are known at the end", field="best_of")
    return n, best_of


def top_k(value: Any) -> int | None:
    """OpenAI has no top_k; vLLM's -1 and 0 mean none, as null does."""
    if value is None or (is_int(value) and value in (-1, 0)):
        return None
    return check_int("top_k", value, -1, 1_000_000, or_else=" (-1 or 0: no limit)")


def logit_bias(value: Any, vocab: int | None) -> dict | None:
    """OpenAI's {token id (a string): bias}; each id must be one of the model's."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise UserError('`logit_bias` must be an object of token id → bias, e.g. {"50256": -100}', field="logit_bias")
    if vocab is not None:
        for key in value:
            token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
            if not is_int(token) or not 0 <= token < vocab:
                raise UserError(
                    f"`logit_bias` token ids must be between 0 and {vocab - 1} (the model's vocabulary), "
                    f"got {json_repr(key)}",
                    field="logit_bias",
                )
    return value


def sampling(body: dict, vocab: int | None) -> dict[str, Any]:
    """The `sampling` object (absent or null temperature and top_p are 1.0, as OpenAI's)."""
    out: dict[str, Any] = {
        "temperature": 1.0 if body.get("temperature") is None else body["temperature"],
        "top_p": 1.0 if body.get("top_p") is None else body["top_p"],
    }
    optional = {
        "seed": body.get("seed"),
        "top_k": top_k(body.get("top_k")),
        "min_p": body.get("min_p"),
        "frequency_penalty": body.get("frequency_penalty"),
        "presence_penalty": body.get("presence_penalty"),
        "repetition_penalty": body.get("repetition_penalty"),
        "logit_bias": logit_bias(body.get("logit_bias"), vocab),
    }
    return {**out, **{k: v for k, v in optional.items() if v is not None}}


def stops(body: dict) -> list[str] | None:
    stop = body.get("stop")
    if stop is None or stop == []:
        return None
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list):
        raise UserError(f"`stop` must be a string or a list of strings, got {json_repr(stop)}", field="stop")
    if len(stop) > MAX_STOPS:
        raise UserError(f"`stop` may hold at most {MAX_STOPS} strings, got {len(stop)}", field="stop")
    return stop


def payload(body: dict, max_tokens: Any, default_max: int | None, vocab: int | None) -> dict:
    """The `generate` fields for the sampling and length fields; the caller adds the prompt. Without
    `max_tokens` and without a default no length is sent: the answer may run to the end of the context
    (vLLM's default; `limits` makes that parse_generate's default)."""
    out: dict[str, Any] = {"sampling": sampling(body, vocab)}
    length = default_max if max_tokens is None else max_tokens
    if length is not None:
        out["max_new_tokens"] = length
    if body.get("min_tokens"):
        out["min_new_tokens"] = body["min_tokens"]
    if body.get("ignore_eos") is not None:
        out["ignore_eos"] = body["ignore_eos"]
    if (stop := stops(body)) is not None:
        out["stop"] = stop
    return out


def limits(context: int | None) -> dict[str, Any]:
    """parse_generate's limits for the API: the model's context bounds the answer and the prompt
    (counted in tokens when the prompt is rendered), not the lab's character caps."""
    return {
        # Any length parses: the prompt plus the answer must fit the context, which the engine checks with
        # the prompt counted, and fanout.context_error words as vLLM does, both numbers named.
        "max_new_tokens": 2**31 - 1,
        "default_max_new_tokens": None,  # no length asked: None to the engine, which gives it the room left
        "messages": MAX_MESSAGES,
        "content_chars": 10**7,  # the request body's own limit comes first; tokens are what count
        "total_chars": 10**7,
        "stop_count": MAX_STOPS,
        "stop_chars": MAX_STOP_CHARS,
        "top_k": 1_000_000,
        "candidates": MAX_TOP_LOGPROBS,
        "prompt_ids": context or 2**31 - 1,  # a remote engine may not say its context: its server decides
    }


def stream_options(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage: usage in every chunk, vLLM's `continuous_usage_stats`)."""
    stream, options = body.get("stream", False), body.get("stream_options")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise UserError(f"`stream` must be true or false, got {json_repr(stream)}", field="stream")
    if options is None:
        return stream, False, False
    known = {"include_usage", "continuous_usage_stats", "include_obfuscation"}
    if not isinstance(options, dict) or set(options) - known:
        raise UserError('`stream_options` must be an object like {"include_usage": true}', field="stream_options")
    if not all(isinstance(v, bool) or v is None for v in options.values()):
        raise UserError("`stream_options` values must be true or false", field="stream_options")
    if not stream:
        return stream, False, False  # lenient: without a stream they change nothing (vLLM 0.32 answers 400)
    return stream, bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def rename_field(exc: UserError, names: dict[str, str]) -> UserError:
    """The error with the kvscope field renamed to the OpenAI one the client sent (`names` adds to
    PARAM_NAMES, e.g. `max_new_tokens` → `max_tokens`), in `field` and in the message."""
    field = {**PARAM_NAMES, **names}.get(exc.field or "", exc.field)
    if field != exc.field:
        exc.message = exc.message.replace(f"`{exc.field}`", f"`{field}`")
        exc.field = field
    return exc
