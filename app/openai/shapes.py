"""What chat and legacy completions share in the OpenAI-compatible API (docs/protocol.md,
"OpenAI-compatible API"): the model ids a client may send, the sampling fields mapped onto a
kvscope `generate` payload, the streaming options, field names as the client sent them, and the
pieces of every answer (finish reason, usage, log-probabilities, server-sent events)."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Iterator

from app.api import public_source
from app.errors import openai_body
from model_runner.errors import UserError
from model_runner.events import Accepted, Event, Finished, Token
from model_runner.request import json_repr

FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}
# parse_generate's field names → the OpenAI names a client sent.
PARAM_NAMES = {"sampling.temperature": "temperature", "sampling.top_p": "top_p", "sampling.seed": "seed"}
TYPABLE = re.compile(r"^[\w.:/@+-]+$")  # an id a client can type: no spaces, no parentheses
UNLOADED = "kvscope"  # the id before the model's facts are known


# ---- model ids ---------------------------------------------------------------------------------


def own_model_id(facts) -> str:
    """The model's own name as a client would type it: its source when that is an id (a hub id, a
    folder name, `fake`, the remote's id), else its name without how it runs
    ("SmolLM2-135M-Instruct (Q4_1 GGUF)" → "SmolLM2-135M-Instruct")."""
    if facts is None:
        return UNLOADED
    source = public_source(facts.source or facts.name) or ""
    if TYPABLE.match(source):
        return source
    name = (public_source(facts.name) or "").split(" (")[0].strip()
    return name if TYPABLE.match(name) else re.sub(r"[^\w.:/@+-]+", "-", name).strip("-") or UNLOADED


def model_ids(facts, served_names: str | list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every id this server answers to: the `--served-model-name` names (the first is the one it
    reports, as vLLM's `model_name`), then the model's own name. One name may come as a plain
    string (KVSCOPE_SERVED_MODEL_NAMES=tiny-chat, which is not JSON)."""
    names = [served_names] if isinstance(served_names, str) else list(served_names or ())
    ids = [str(name) for name in names]
    own = own_model_id(facts)
    return ids + [own] if own not in ids else ids


def check_model(body: dict, ids: list[str]) -> None:
    """An unknown `model` is OpenAI's 404 `model_not_found`; an absent one means the served model."""
    model = body.get("model")
    if model is not None and model not in ids:
        raise UserError(
            f"the model {json_repr(model)} does not exist here; this server runs {', '.join(map(repr, ids))}",
            code="model_not_found",
            field="model",
        )


# ---- request fields ----------------------------------------------------------------------------


def refuse_unknown(body: dict, known: tuple[str, ...]) -> None:
    for name in body:
        if name not in known:
            raise UserError(f"unknown or unsupported field {json_repr(str(name))}", field=str(name)[:100])


def check_one_choice(body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise UserError(f"`n` must be 1 (one answer per request), got {json_repr(n)}", field="n")


def sampling_payload(body: dict, max_tokens: Any, default_max_tokens: int | None = None) -> dict[str, Any]:
    """The `generate` fields for OpenAI's sampling fields (absent or null `temperature` and
    `top_p` are 1.0, as OpenAI's); the caller adds the prompt or messages."""
    sampling = {"temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
    sampling = {k: (1.0 if v is None else v) for k, v in sampling.items()}
    if body.get("seed") is not None:
        sampling["seed"] = body["seed"]
    payload: dict[str, Any] = {"sampling": sampling}
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if max_tokens is not None:
        payload["max_new_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        payload["stop"] = [stop] if isinstance(stop, str) else stop
    return payload


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream, options = body.get("stream", False), body.get("stream_options")
    if not isinstance(stream, bool):
        raise UserError(f"`stream` must be true or false, got {json_repr(stream)}", field="stream")
    if options is None:
        return stream, False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise UserError('`stream_options` must be an object like {"include_usage": true}', field="stream_options")
    if not stream:
        raise UserError("`stream_options` needs `stream` set to true", field="stream_options")
    return stream, options.get("include_usage", False)


def rename_field(exc: UserError, names: dict[str, str]) -> UserError:
    """The error with the kvscope field renamed to the OpenAI one the client sent (`names` adds to
    PARAM_NAMES, e.g. `max_new_tokens` → `max_tokens`), in `field` and in the message."""
    field = {**PARAM_NAMES, **names}.get(exc.field or "", exc.field)
    if field != exc.field:
        exc.message = exc.message.replace(f"`{exc.field}`", f"`{field}`")
        exc.field = field
    return exc


# ---- answers -----------------------------------------------------------------------------------


def logprob(prob: float) -> float:
    return math.log(prob) if prob > 0 else -9999.0


def finish_reason(event: Finished) -> str:
    return FINISH_REASONS.get(event.reason, "length")


def usage(accepted: Accepted | None, finished: Finished) -> dict[str, int]:
    prompt = accepted.prompt_tokens if accepted is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": finished.tokens, "total_tokens": prompt + finished.tokens}


def terminal_error(event: Event) -> UserError:
    """A UserError for a request that ended without finishing (an engine error or a cancel)."""
    d = event.to_dict()
    if d["type"] == "error":
        return UserError(d["message"], code=d["code"], field=d.get("field"))
    return UserError(f"the request was cancelled ({d['cause']})", code="cancelled")


def finished_events(events: list[Event]) -> tuple[Accepted | None, Finished]:
    """A finished request's `accepted` and `finished` events; a request that ended otherwise raises
    its error (answered in OpenAI's shape)."""
    accepted = next((e for e in events if isinstance(e, Accepted)), None)
    if not isinstance(events[-1], Finished):
        raise terminal_error(events[-1])
    return accepted, events[-1]


def sse(data: Any) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def sse_stream(
    events: Iterator[Event],
    top: int | None,
    include_usage: bool,
    token_object: Callable[[Token], dict[str, Any]],
    finish_object: Callable[[Finished], dict[str, Any]],
    usage_object: dict[str, Any],
) -> Iterator[str]:
    """The server-sent events of one streamed answer: an object per token that releases text (or
    carries logprobs), one with the finish reason, with `include_usage` `usage_object` holding the
    usage, an engine error or cancel as an error object, then `data: [DONE]`."""
    accepted = None
    for event in events:
        if isinstance(event, Accepted):
            accepted = event
        elif isinstance(event, Token) and (event.text or top is not None):
            yield sse(token_object(event))
        elif isinstance(event, Finished):
            yield sse(finish_object(event))
            if include_usage:
                yield sse({**usage_object, "usage": usage(accepted, event)})
        elif event.terminal:
            yield sse(openai_body(terminal_error(event)))
    yield sse("[DONE]")
