"""A generation request's validated parameters, from untrusted JSON.

`parse_generate` is the single gatekeeper: every field is checked and a bad one raises `UserError`
naming the field and its limit, in the spirit of TGI's messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model_runner.protocol.constraint import Constraint, check_ending, from_wire
from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    int_field,
    is_number,
    json_repr,
)

ROLES = ("system", "user", "assistant", "retrieved")
DELIVERY_MODES = ("stream", "buffered")
OVERFLOW_POLICIES = ("reject", "truncate_history", "shrink_output")
DEFAULT_MAX_NEW_TOKENS = 128  # the protocol's answer length when `max_new_tokens` is absent
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
    "penalty": 2.0,  # frequency and presence penalties: -2 … 2 (OpenAI's range)
    "repetition_penalty": 2.0,
    "logit_bias": 300,  # tokens biased in one request
    "bias": 100.0,  # each bias: -100 … 100 (OpenAI's range)
    "candidates": 20,  # alternatives per token (OpenAI's top_logprobs limit)
    "prompt_ids": 8192,
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
    min_p: float = 0.0  # drop tokens below min_p × the likeliest token's probability (0 = off)
    # OpenAI's penalties over the answer so far: logit − frequency × count − presence × (count > 0).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # CTRL's penalty over the prompt and the answer (vLLM's and transformers'): 1 = off.
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """True when a penalty or a bias changes the logits before the choice (else they are the model's)."""
        return bool(
            self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0 or self.logit_bias
        )


@dataclass(frozen=True)
class GenerateParams:
    messages: tuple[Message, ...]
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS  # None: to the end of the context window (/v1's default)
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
    # End tokens are not chosen before this many tokens, and stop strings not matched (vLLM's min_tokens).
    min_new_tokens: int = 0
    ignore_eos: bool = False  # an end token does not end the answer (it runs to max_new_tokens)
    candidates: int = 5  # alternatives each token event carries (the lab's 5; the OpenAI API asks up to 20)
    # Per prompt position, the log-probability of the prompt's own next token and this many alternatives,
    # from the prompt's one prefill (OpenAI's echo with logprobs); None = not computed.
    prompt_logprobs: int | None = None
    # A prompt sent as token ids (POST /v1/completions): run as sent, never re-tokenized; the one message
    # holds its decoded text. Empty: the prompt is the messages' text.
    prompt_ids: tuple[int, ...] = ()
    # What the answer must match (model_runner/protocol/constraint.py: a JSON schema, a regex, one of some
    # choices, a grammar); None = free text.
    constraint: Constraint | None = None


# ---- validation -----------------------------------------------------------------------------


def _choice(data: dict, name: str, choices: tuple[str, ...], default: str) -> str:
    return check_choice(name, data.get(name, default), choices)


def _messages(data: dict, limits: dict, roles: tuple[str, ...]) -> tuple[Message, ...]:
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise UserError("`messages` must be a non-empty list of {role, content} objects", field="messages")
    if len(raw) > limits["messages"]:
        raise UserError(f"`messages` may hold at most {limits['messages']} messages, got {len(raw)}", field="messages")
    messages, total = [], 0
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"`{where}` must be an object with `role` and `content`", field=where)
        _refuse_unknown(item, MESSAGE_FIELDS, where)
        role, content = item.get("role"), item.get("content")
        if role not in roles:
            raise UserError(
                f"`{where}.role` must be one of {', '.join(roles)}, got {json_repr(role)}", field=f"{where}.role"
            )
        if not isinstance(content, str):
            raise UserError(f"`{where}.content` must be a string, got {json_repr(content)}", field=f"{where}.content")
        if len(content) > limits["content_chars"]:
            raise UserError(
                f"`{where}.content` may be at most {limits['content_chars']:,} characters, got {len(content):,}",
                field=f"{where}.content",
            )
        total += len(content)
        messages.append(Message(role, content))
    if total > limits["total_chars"]:
        raise UserError(
            f"`messages` may hold at most {limits['total_chars']:,} characters in all, got {total:,}", field="messages"
        )
    if messages[-1].role != "user" or not messages[-1].content.strip():
        raise UserError("`messages` must end with a non-empty `user` message", field=f"messages[{len(messages) - 1}]")
    return tuple(messages)


def _sampling(data: dict, limits: dict) -> SamplingParams:
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
    top_k = int_field(raw, "top_k", 1, limits["top_k"], None, "sampling.top_k")
    seed = int_field(raw, "seed", 0, LIMITS["seed"], None, "sampling.seed")
    penalty = limits["penalty"]
    return SamplingParams(
        float(temperature),
        top_k,
        float(top_p),
        seed,
        min_p=float(check_number("sampling.min_p", raw.get("min_p", 0.0), 0.0, 1.0)),
        frequency_penalty=float(
            check_number("sampling.frequency_penalty", raw.get("frequency_penalty", 0.0), -penalty, penalty)
        ),
        presence_penalty=float(
            check_number("sampling.presence_penalty", raw.get("presence_penalty", 0.0), -penalty, penalty)
        ),
        repetition_penalty=float(
            check_number(
                "sampling.repetition_penalty",
                raw.get("repetition_penalty", 1.0),
                0.0,
                limits["repetition_penalty"],
                low_open=True,
            )
        ),
        logit_bias=_logit_bias(raw.get("logit_bias"), limits),
    )


def _logit_bias(raw: Any, limits: dict) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (ids as JSON keys are strings) → sorted (id, bias) pairs; the id's range is the
    model's vocabulary, checked where the model is known (the OpenAI API; the sampler refuses the rest)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise UserError(
            '`sampling.logit_bias` must be an object of token id → bias, e.g. {"50256": -100}',
            field="sampling.logit_bias",
        )
    if len(raw) > limits["logit_bias"]:
        raise UserError(
            f"`sampling.logit_bias` may bias at most {limits['logit_bias']} tokens, got {len(raw)}",
            field="sampling.logit_bias",
        )
    pairs = []
    for key, bias in raw.items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        check_int("sampling.logit_bias token id", token, 0, LIMITS["seed"])
        pairs.append((token, float(check_number(f"sampling.logit_bias[{key}]", bias, -limits["bias"], limits["bias"]))))
    return tuple(sorted(pairs))


def _stop(data: dict, limits: dict) -> tuple[str, ...]:
    raw = data.get("stop", []) or []
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise UserError("`stop` must be a list of strings", field="stop")
    if len(raw) > limits["stop_count"]:
        raise UserError(f"`stop` may hold at most {limits['stop_count']} strings, got {len(raw)}", field="stop")
    for s in raw:
        if not 1 <= len(s) <= limits["stop_chars"]:
            raise UserError(
                f"each `stop` string must be 1 to {limits['stop_chars']} characters, got {len(s)}", field="stop"
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
# WebSocket frame holds (app/ws/session.py reads them) and a trace's request keeps.
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
    "min_new_tokens",
    "ignore_eos",
    "candidates",
    "prompt_logprobs",
    "prompt_ids",
    "constraint",
)
FRAME_FIELDS = ("type", "request_id")
SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
)
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


def _prompt_ids(data: dict, limits: dict) -> tuple[int, ...]:
    raw = data.get("prompt_ids") or []
    if not isinstance(raw, list) or len(raw) > limits["prompt_ids"]:
        raise UserError(
            f"`prompt_ids` must be a list of at most {limits['prompt_ids']:,} token ids", field="prompt_ids"
        )
    for token in raw:
        check_int("prompt_ids", token, 0, LIMITS["seed"])
    return tuple(raw)


def parse_generate(data: Any, limits: dict | None = None, roles: tuple[str, ...] = ROLES) -> GenerateParams:
    """Validate an untrusted `generate` payload; raise UserError naming the first bad field. A field
    the protocol does not name (besides the frame's `type` and `request_id`) is refused by name,
    after the named fields are checked. `limits` replaces some of LIMITS (the OpenAI API's are the
    model's: its context, not the lab's caps) and may set `default_max_new_tokens` (None: an answer
    without a length runs to the end of the context), `roles` the message roles allowed."""
    if not isinstance(data, dict):
        raise UserError("a generate request must be a JSON object", field=None)
    limits = {"default_max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **LIMITS, **(limits or {})}
    params = GenerateParams(
        messages=_messages(data, limits, roles),
        max_new_tokens=int_field(data, "max_new_tokens", 1, limits["max_new_tokens"], limits["default_max_new_tokens"]),
        sampling=_sampling(data, limits),
        stop=_stop(data, limits),
        delivery=_choice(data, "delivery", DELIVERY_MODES, "stream"),
        kv_cache=_bool(data, "kv_cache", True),
        prefill_chunk=int_field(data, "prefill_chunk", 0, LIMITS["prefill_chunk"], 0),
        overflow=_choice(data, "overflow", OVERFLOW_POLICIES, "reject"),
        timeout_s=_timeout(data),
        inspect_attention=_inspect_attention(data),
        min_new_tokens=int_field(data, "min_new_tokens", 0, limits["max_new_tokens"], 0),
        ignore_eos=_bool(data, "ignore_eos", False),
        candidates=int_field(data, "candidates", 0, limits["candidates"], 5),
        prompt_logprobs=int_field(data, "prompt_logprobs", 0, limits["candidates"], None),
        prompt_ids=_prompt_ids(data, limits),
        constraint=from_wire(data.get("constraint")),
    )
    _refuse_unknown(data, FIELDS + FRAME_FIELDS)
    if params.prefill_chunk and not params.kv_cache:
        raise UserError(
            "`prefill_chunk` needs the KV cache: each chunk of the prompt attends to the keys and "
            "values of the chunks before it; set `kv_cache` to true or `prefill_chunk` to 0",
            field="prefill_chunk",
        )
    check_ending(params.constraint, params.ignore_eos, params.min_new_tokens, ("ignore_eos", "min_new_tokens"))
    if params.max_new_tokens is not None and params.min_new_tokens > params.max_new_tokens:
        raise UserError(
            f"`min_new_tokens` ({params.min_new_tokens}) may not exceed `max_new_tokens` ({params.max_new_tokens})",
            field="min_new_tokens",
        )
    if params.prompt_logprobs is not None and not params.kv_cache:
        raise UserError(
            "`prompt_logprobs` come from the prompt's prefill over the KV cache; set `kv_cache` to true",
            field="prompt_logprobs",
        )
    if params.inspect_attention and not params.kv_cache:
        raise UserError(
            "`inspect.attention` shows what each new token reads from the KV cache, so it needs the cache; "
            "set `kv_cache` to true or `inspect.attention` to false",
            field="inspect.attention",
        )
    return params
