"""One object per request: its validated parameters, where it stands (state, tokens so far), the
worker's working state for it (cache, detokenizer, stop checker, sampler seed, clock stamps) and
the stream its events go to. The scheduler changes `state`; the engine's worker fills the rest."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from .request import GenerateParams

if TYPE_CHECKING:  # the working state's types need torch; the scheduler imports this module without it
    from .detokenizer import IncrementalDetokenizer
    from .kv_cache import KVCache
    from .stopping import StopChecker
    from .stream import RequestHandle


class State(str, Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(eq=False)  # identity, not value: two requests may carry the same client id
class Sequence:
    id: str
    params: GenerateParams
    submitted_at: float = field(default_factory=time.monotonic)
    state: State = State.QUEUED
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 0  # after the budget decision
    cancel_cause: str | None = None  # set from any thread; the worker acts on it between steps
    stream: RequestHandle | None = None
    # The worker's working state, made when prefill starts and dropped at the end.
    cache: KVCache | None = None
    detok: IncrementalDetokenizer | None = None
    stopper: StopChecker | None = None
    generator: Any = None  # torch.Generator for seeded sampling
    # Clock stamps (time.monotonic) for the metrics.
    prefill_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    first_text_at: float | None = None
    released_text: str = ""

    @property
    def started(self) -> bool:
        """True once prefill has begun (its working state exists)."""
        return self.prefill_start is not None

    @property
    def text(self) -> str:
        return self.stopper.text if self.stopper else ""

    def ms_since_submit(self, now: float | None = None) -> float:
        return ((now if now is not None else time.monotonic()) - self.submitted_at) * 1000.0

    def release(self) -> None:
        """Drop the working state at the end: the KV tensors are freed now, not when the stream is collected."""
        self.cache = None
        self.generator = None
