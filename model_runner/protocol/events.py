"""Every event a request emits, as frozen dataclasses that serialise to one JSON object each.

Times (`t_ms`) are milliseconds since the request was submitted, on a monotonic clock.
Each request gets exactly one terminal event: `finished`, `cancelled` or `error`. Events take
keyword arguments only, so a field added or reordered can never shift another's value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = 1
TERMINAL_TYPES = frozenset({"finished", "cancelled", "error"})


@dataclass(frozen=True, kw_only=True)
class Candidate:
    id: int
    text: str
    prob: float


@dataclass(frozen=True, kw_only=True)
class Event:
    type: ClassVar[str] = "event"
    request_id: str
    t_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "schema": SCHEMA_VERSION, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_TYPES


@dataclass(frozen=True, kw_only=True)
class Accepted(Event):
    """The request passed validation; the prompt is counted and the context budget decided."""

    type: ClassVar[str] = "accepted"
    prompt_tokens: int
    content_tokens: int
    template_tokens: int
    max_new_tokens: int
    context_window: int
    budget: dict[str, Any]
    delivery: str
    kv_cache: bool
    prefill_chunk: int


@dataclass(frozen=True, kw_only=True)
class Queued(Event):
    type: ClassVar[str] = "queued"
    position: int  # 1 = next to run
    ahead: int  # requests that run before this one (the running ones included)
    reason: str = ""  # why it waits: next to run, batch full, KV blocks, static batch, preempted


@dataclass(frozen=True, kw_only=True)
class PrefillStart(Event):
    type: ClassVar[str] = "prefill_start"
    prompt_tokens: int
    chunk_size: int  # 0 = the whole prompt in one pass
    cached_tokens: int = 0  # prompt tokens whose KV blocks came from the prefix cache, not computed


@dataclass(frozen=True, kw_only=True)
class PrefillChunk(Event):
    type: ClassVar[str] = "prefill_chunk"
    start: int
    end: int
    ms: float
    cache_tokens: int


@dataclass(frozen=True, kw_only=True)
class PrefillEnd(Event):
    type: ClassVar[str] = "prefill_end"
    tokens: int
    ms: float
    tokens_per_s: float
    cache_tokens: int
    cache_bytes_measured: int
    cache_bytes_formula: int
    first_token: dict[str, Any]  # {id, text, prob, candidates: [Candidate...]}
    kv_blocks: int = 0  # paged KV blocks the request holds
    kv_bytes_reserved: int = 0  # those blocks' bytes (the last one may be part empty)
    batch_size: int = 1  # requests that shared the step


@dataclass(frozen=True, kw_only=True)
class Token(Event):
    type: ClassVar[str] = "token"
    index: int  # 0 = the first generated token (it came from the prefill logits)
    id: int
    text: str  # visible text released by this token ("" while pending or buffered)
    pending: bool  # part of a character that is not complete yet
    step_ms: float  # 0 for index 0: its cost is the prefill
    cache_tokens: int
    cache_bytes_measured: int
    cache_bytes_formula: int
    prob: float
    candidates: list[Candidate] = field(default_factory=list)
    kv_blocks: int = 0
    kv_bytes_reserved: int = 0
    batch_size: int = 1  # requests whose tokens shared this step's forward pass
    # A constrained request's mask at this step (model_runner/shared/constraints.py): {allowed: vocabulary
    # tokens the grammar allowed, first_allowed: whether the model's own first choice was one}; else None.
    mask: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Attention(Event):
    """Which cached positions were read to choose token `index` (requests with `inspect.attention`):
    the attention of the step's last query (position `query_position`) over the `positions` cached
    ones, from the model's own forward. Sent just before that token's `token` event."""

    type: ClassVar[str] = "attention"
    index: int  # the token this attention chose (0: from the prefill)
    query_position: int  # the query's position; it reads positions 0 … query_position
    positions: int
    bin_width: int  # positions per histogram bin
    all: dict[str, Any]  # the mean over layers of each layer's mean over heads: {top, bins}
    layers: list[dict[str, Any]]  # per layer: {mean: {top, bins}, sharpest: {head, entropy, top}}


@dataclass(frozen=True, kw_only=True)
class Preempted(Event):
    """The KV pool ran out: the request gave its blocks back and waits to recompute its tokens."""

    type: ClassVar[str] = "preempted"
    blocks_freed: int
    tokens: int  # tokens (prompt + answer so far) it will prefill again


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """A preempted request is admitted again and recomputes its tokens in one prefill."""

    type: ClassVar[str] = "resumed"
    tokens: int


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    type: ClassVar[str] = "finished"
    reason: str  # eos | max_tokens | stop_string | context_full | timeout
    token_index: int  # index of the token that ended it (-1 when none was generated)
    tokens: int
    text: str
    metrics: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Cancelled(Event):
    type: ClassVar[str] = "cancelled"
    reason: str  # always "cancelled", so `reason` reads the same on every terminal event
    cause: str  # client | disconnect | slow_client | shutdown
    state: str  # the state it was cancelled in: queued | prefill | decode | preempted
    tokens: int
    text: str  # the partial answer: never complete
    metrics: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Error(Event):
    type: ClassVar[str] = "error"
    code: str
    message: str
    field: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Accepted,
        Queued,
        PrefillStart,
        PrefillChunk,
        PrefillEnd,
        Token,
        Attention,
        Preempted,
        Resumed,
        Finished,
        Cancelled,
        Error,
    )
}
