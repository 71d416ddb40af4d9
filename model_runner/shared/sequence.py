"""One object per request: its validated parameters, where it stands (state, tokens so far), the
worker's working state for it (cache, detokenizer, stop checker, sampler seed, clock stamps) and
the stream its events go to. The scheduler changes `state`; the engine's worker fills the rest."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from model_runner.protocol.request import GenerateParams

if TYPE_CHECKING:  # the working state's types need torch; the scheduler imports this module without it
    from model_runner.shared.stream import RequestHandle
    from model_runner.text.detokenizer import IncrementalDetokenizer
    from model_runner.text.stopping import StopChecker


class State(str, Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    PREEMPTED = "preempted"  # its blocks were taken back; it waits to recompute its tokens
    DONE = "done"


@dataclass(eq=False)  # identity, not value: two requests may carry the same client id
class Sequence:
    id: str  # the client's id (may repeat across clients)
    params: GenerateParams
    key: str = ""  # the engine's own unique id, also the paged cache's request id
    label: str = ""  # who sent it, for observers (e.g. "ws 3"), never the prompt
    feed_text: bool | None = None  # its prompt/answer may go to the engine feed (None: the server decides)
    submitted_at: float = field(default_factory=time.monotonic)
    state: State = State.QUEUED
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 0  # after the budget decision
    cancel_cause: str | None = None  # set from any thread; the worker acts on it between steps
    stream: RequestHandle | None = None
    # KV cache bookkeeping: positions whose keys and values are in the paged pool.
    cached: int = 0
    prefix_hit: int = 0  # prompt tokens found in the prefix cache instead of computed
    preemptions: int = 0
    chunk_size: int = 0  # its prefill chunk size, fixed when admitted (0 = the whole prompt at once)
    # The worker's working state, made when prefill starts and dropped at the end.
    detok: IncrementalDetokenizer | None = None
    stopper: StopChecker | None = None
    generator: Any = None  # torch.Generator for seeded sampling
    guide: Any = None  # a constrained request's grammar matcher and mask (model_runner/shared/constraints.py)
    # Clock stamps (time.monotonic) for the metrics.
    prefill_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    first_text_at: float | None = None
    released_text: str = ""
    # For requests with `prompt_logprobs`: per prompt position, (log-probability of its token given the
    # tokens before it, [(id, log-probability) of the likeliest alternatives]); None at position 0 and
    # until its prefill has run. Filled by the batched forward (local/step/prompt_logprobs.py), read after the end.
    prompt_logprobs: list | None = None

    @property
    def started(self) -> bool:
        """True once prefill has begun (its working state exists)."""
        return self.prefill_start is not None

    @property
    def tokens(self) -> list[int]:
        """Every token of the request so far: the prompt, then the answer."""
        return self.prompt_ids + self.output_ids

    @property
    def pending(self) -> list[int]:
        """The tokens whose keys and values are not in the cache yet: the next forward's input."""
        return self.tokens[self.cached :]

    @property
    def uses_cache(self) -> bool:
        return self.params.kv_cache

    @property
    def text(self) -> str:
        return self.stopper.text if self.stopper else ""

    def ms_since_submit(self, now: float | None = None) -> float:
        return ((now if now is not None else time.monotonic()) - self.submitted_at) * 1000.0

    def release(self) -> None:
        """Drop the working state at the end (the engine has given its KV blocks back)."""
        self.generator = None
        self.guide = None
        self.cached = 0
