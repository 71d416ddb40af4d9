"""A generation request's validated parameters, from untrusted JSON.

`parse_generate` is the single gatekeeper: every field is checked and a bad one raises `UserError`
naming the field and its limit, in the spirit of TGI's messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model_runner.errors import UserError
from model_runner.fields import check_bool, check_choice, int_field, is_number, json_repr

ROLES = ("system", "user", "assistant", "retrieved")
DELIVERY_MODES = ("stream", "buffered")
OVERFLOW_POLICIES = ("reject", "truncate_history", "shrink_output")
LIMITS = {
    "messages": 50,
    "content_chars": 20_000,
    "total_chars": 60_000,
    "max_new_tokens": 1024,
    "temperature": 2.0,
    "top_k": 1000,
    "stop_count": 4,
    "stop_chars": 64,
    "prefill_chunk": 8192,
    "timeout_s": 300.0,
    "seed": 2**31 - 1,
}


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerateParams:
    messages: tuple[Message, ...]
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    delivery: str = "stream"
    kv_cache: bool = True
    prefill_chunk: int = 0  # 0 = the whole prompt in one forward pass
    overflow: str = "reject"
    timeout_s: float | None = None  # None = the engine's server-side limit
    # False: the one message's content is the prompt as written, without the chat template
    # (POST /v1/completions sets it; the WebSocket protocol has no such field).
    chat_template: bool = True
    # True: each generated token also sends which cached positions its query read (an `attention`
    # event); `"inspect": {"attention": true}` on the wire.
    inspect_attention: bool = False


# ---- validation -----------------------------------------------------------------------------


def _choice(data: dict, name: str, choices: tuple[str, ...], default: str) -> str:
    return check_choice(name, data.get(name, default), choices)


def _messages(data: dict) -> tuple[Message, ...]:
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise UserError("`messages` must be a non-empty list of {role, content} objects", field="messages")
    if len(raw) > LIMITS["messages"]:
        raise UserError(f"`messages` may hold at most {LIMITS['messages']} messages, got {len(raw)}", field="messages")
    messages, total = [], 0
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"`{where}` must be an object with `role` and `content`", field=where)
        _refuse_unknown(item, MESSAGE_FIELDS, where)
        role, content = item.get("role"), item.get("content")
        if role not in ROLES:
            raise UserError(
                f"`{where}.role` must be one of {', '.join(ROLES)}, got {json_repr(role)}", field=f"{where}.role"
            )
        if not isinstance(content, str):
            raise UserError(f"`{where}.content` must be a string, got {json_repr(content)}", field=f"{where}.content")
        if len(content) > LIMITS["content_chars"]:
            raise UserError(
                f"`{where}.content` may be at most {LIMITS['content_chars']:,} characters, got {len(content):,}",
                field=f"{where}.content",
            )
        total += len(content)
        messages.append(Message(role, content))
    if total > LIMITS["total_chars"]:
        raise UserError(
            f"`messages` may hold at most {LIMITS['total_chars']:,} characters in all, got {total:,}", field="messages"
        )
    if messages[-1].role != "user" or not messages[-1].content.strip():
        raise UserError("`messages` must end with a non-empty `user` message", field=f"messages[{len(messages) - 1}]")
    return tuple(messages)


def _sampling(data: dict) -> SamplingParams:
    raw = data.get("sampling", {}) or {}
    if not isinstance(raw, dict):
        raise UserError("`sampling` must be an object", field="sampling")
    _refuse_unknown(raw, SAMPLING_FIELDS, "sampling")
    temperature = raw.get("temperature", 0.0)
    if not is_number(temperature) or not 0.0 <= temperature <= LIMITS["temperature"]:
        raise UserError(
            f"`sampling.temperature` must be a number between 0 and {LIMITS['temperature']:g}, got {json_repr(temperature)}",
            field="sampling.temperature",
        )
    top_p = raw.get("top_p", 1.0)
    if not is_number(top_p) or not 0.0 < top_p <= 1.0:
        raise UserError(f"`sampling.top_p` must be in (0, 1], got {json_repr(top_p)}", field="sampling.top_p")
    top_k = int_field(raw, "top_k", 1, LIMITS["top_k"], None, "sampling.top_k")
    seed = int_field(raw, "seed", 0, LIMITS["seed"], None, "sampling.seed")
    return SamplingParams(float(temperature), top_k, float(top_p), seed)


def _stop(data: dict) -> tuple[str, ...]:
    raw = data.get("stop", []) or []
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise UserError("`stop` must be a list of strings", field="stop")
    if len(raw) > LIMITS["stop_count"]:
        raise UserError(f"`stop` may hold at most {LIMITS['stop_count']} strings, got {len(raw)}", field="stop")
    for s in raw:
        if not 1 <= len(s) <= LIMITS["stop_chars"]:
            raise UserError(
                f"each `stop` string must be 1 to {LIMITS['stop_chars']} characters, got {len(s)}", field="stop"
            )
    return tuple(raw)


def _inspect_attention(data: dict) -> bool:
    raw = data.get("inspect") or {}
    if not isinstance(raw, dict):
        raise UserError('`inspect` must be an object such as {"attention": true}', field="inspect")
    _refuse_unknown(raw, INSPECT_FIELDS, "inspect")
    value = raw.get("attention", False)
    if not isinstance(value, bool):
        raise UserError(f"`inspect.attention` must be true or false, got {json_repr(value)}", field="inspect.attention")
    return value


def _timeout(data: dict) -> float | None:
    value = data.get("timeout_s")
    if value is None:
        return None
    if not is_number(value) or not 0 < value <= LIMITS["timeout_s"]:
        raise UserError(
            f"`timeout_s` must be a number in (0, {LIMITS['timeout_s']:g}], got {json_repr(value)}", field="timeout_s"
        )
    return float(value)


def _bool(data: dict, name: str, default: bool) -> bool:
    return check_bool(name, data.get(name, default))


# The fields a `generate` payload may carry: its parameters, plus `type` and `request_id`, which the
# WebSocket frame holds (app/session.py reads them) and a trace's request keeps.
FIELDS = (
    "messages",
    "max_new_tokens",
    "sampling",
    "stop",
    "delivery",
    "kv_cache",
    "prefill_chunk",
    "overflow",
    "timeout_s",
    "inspect",
)
FRAME_FIELDS = ("type", "request_id")
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")
MESSAGE_FIELDS = ("role", "content")
INSPECT_FIELDS = ("attention",)


def _refuse_unknown(data: dict, known: tuple[str, ...], where: str = "") -> None:
    """A field the protocol does not name is refused by name, so a typo such as `max_new_token`
    never runs silently with the default."""
    for name in data:
        if name in known:
            continue
        label = (f"{where}.{name}" if where else str(name))[:100]
        named = [k for k in known if k not in FRAME_FIELDS]
        close = [k for k in named if _close(str(name), k)]
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise UserError(
            f"unknown field {json_repr(label)} in {f'`{where}`' if where else 'the request'}{hint} "
            f"(allowed: {', '.join(named)})",
            field=label,
        )


def _close(name: str, known: str) -> bool:
    """A likely typo: the same name but for case, `-`/`_`, or one letter added, dropped or changed."""
    a, b = name.lower().replace("-", "_"), known
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def parse_generate(data: Any) -> GenerateParams:
    """Validate an untrusted `generate` payload; raise UserError naming the first bad field. A field
    the protocol does not name (besides the frame's `type` and `request_id`) is refused by name,
    after the named fields are checked."""
    if not isinstance(data, dict):
        raise UserError("a generate request must be a JSON object", field=None)
    params = GenerateParams(
        messages=_messages(data),
        max_new_tokens=int_field(data, "max_new_tokens", 1, LIMITS["max_new_tokens"], 128),
        sampling=_sampling(data),
        stop=_stop(data),
        delivery=_choice(data, "delivery", DELIVERY_MODES, "stream"),
        kv_cache=_bool(data, "kv_cache", True),
        prefill_chunk=int_field(data, "prefill_chunk", 0, LIMITS["prefill_chunk"], 0),
        overflow=_choice(data, "overflow", OVERFLOW_POLICIES, "reject"),
        timeout_s=_timeout(data),
        inspect_attention=_inspect_attention(data),
    )
    _refuse_unknown(data, FIELDS + FRAME_FIELDS)
    if params.prefill_chunk and not params.kv_cache:
        raise UserError(
            "`prefill_chunk` needs the KV cache: each chunk of the prompt attends to the keys and "
            "values of the chunks before it; set `kv_cache` to true or `prefill_chunk` to 0",
            field="prefill_chunk",
        )
    if params.inspect_attention and not params.kv_cache:
        raise UserError(
            "`inspect.attention` shows what each new token reads from the KV cache, so it needs the cache; "
            "set `kv_cache` to true or `inspect.attention` to false",
            field="inspect.attention",
        )
    return params
