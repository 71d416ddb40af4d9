"""The engine: one worker thread owns the model and the paged KV pool and runs `step()` =
schedule → one batched forward (local/step/forward.py: a decode token for each running request plus prefill
chunks of newly admitted ones) → postprocess (local/postprocess.py: sample per request, stop checks, events).
Any thread may submit, cancel, change the scheduling policy or hold admissions (local/controls.py);
each request's events go to its own bounded stream and the engine feed (local/announce.py) goes to
observers, so the worker never waits on a slow reader. Every request ends with exactly one terminal
event (finished, cancelled or error)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

import torch

from model_runner.loading.loader import LoadedModel, ModelFacts, load
from model_runner.local.announce import Announcer
from model_runner.local.config import EngineConfig
from model_runner.local.controls import AdmissionControls
from model_runner.local.kv_cache import PagedKVPool, blocks_for_megabytes, default_blocks
from model_runner.local.model import compiled as aot
from model_runner.local.model.decoders import decoder_for, decoder_report
from model_runner.local.postprocess import Postprocess, terminal_event
from model_runner.local.scheduler import Scheduler, StepPlan
from model_runner.local.step.forward import BatchForward, Forwards, run_step
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import GenerateParams
from model_runner.shared.base import EngineBase
from model_runner.shared.constraints import compiled
from model_runner.shared.feed import EngineFeed
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence, State
from model_runner.shared.stream import RequestHandle
from model_runner.text.prompt import plan

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger("kvscope.engine")


class Engine(EngineBase, AdmissionControls):
    def __init__(self, config: EngineConfig = EngineConfig(), loaded: LoadedModel | None = None):
        super().__init__()
        self.config = config
        self.loaded = loaded
        self.scheduler = Scheduler(config.max_queue, config.policy)
        self.feed = EngineFeed()
        self.pool: PagedKVPool | None = None
        self._usage: dict[str, int] | None = None  # the pool's usage after the last step (read by any thread)
        self._forward: BatchForward | None = None
        self._forward_invariant = False  # the mode self._forward was made for
        self._forwards: Forwards | None = None  # each mode's, once the model is loaded
        self._decoder: dict[str, Any] | None = None  # which decoder runs the steps, once the model is loaded
        self._compiled: aot.Compiled | None = None  # its decode stretches compiled ahead of time, once loaded
        self._post: Postprocess | None = None  # with the pool, once the model is loaded
        self._announce = Announcer(self.feed, config.feed_text)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._status, self._reason, self._stopping = "loading", None, False
        self._closed: str | None = None  # why the worker takes no more requests (set under the lock)
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._keys = itertools.count(1)
        self.steps = 0  # model steps run, for tests and health
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        if loaded is not None:
            self._prepare()

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._worker, name="kvscope-engine", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def facts(self) -> ModelFacts | None:
        return self.loaded.facts if self.loaded else None

    @property
    def local(self) -> Engine:
        """This engine runs the model here: it is its own `LocalControls` (model_runner/interface.py)."""
        return self

    @property
    def tokens_generated(self) -> int:
        """Every token chosen since start, in all (the class view's tokens/s)."""
        return self._post.tokens_generated if self._post is not None else 0

    def health(self) -> tuple[bool, str]:
        if self._status == "failed":
            return False, f"model failed to load: {self._reason}"
        if self._closed is not None or self._thread is None or not self._thread.is_alive():
            return False, f"engine worker is not running: {self._closed or self._reason or 'not started'}"
        return True, self._status

    def _prepare(self) -> None:
        """The paged pool, the batched forward and the postprocess, once the model is loaded."""
        facts, size = self.loaded.facts, self.config.block_size
        blocks = (
            blocks_for_megabytes(self.config.kv_cache_mb, facts, size)
            if self.config.kv_cache_mb is not None
            else default_blocks(facts, size)
        )
        self.pool = PagedKVPool(self.loaded.model, facts, blocks, size, self.scheduler.policy.max_batch_tokens)
        self.pool.set_prefix_caching(self.scheduler.policy.prefix_caching)
        decoder = decoder_for(self.loaded.model, self.pool, self.config.decoder)
        self._decoder = decoder_report(decoder, self.loaded.model, self.config.decoder)
        self._compiled = aot.start(decoder, self.config.compile, self.loaded.model.device)
        self._forwards = Forwards(self.loaded.model, self.pool, decoder, self.config.cuda_graphs)
        self._forward = self._forwards.of(self.scheduler.policy)
        self._forward_invariant = self.scheduler.policy.batch_invariant
        self._post = Postprocess(self.loaded, self.pool, self.scheduler, self._end_now)
        self._usage = self.pool.usage().to_dict()
        self._status = "ready"

    # ---- API for any thread ----------------------------------------------------------------------

    def describe_prompt(self, params: GenerateParams) -> dict[str, Any]:
        self._require_ready()
        return plan(self.loaded.tokenizer, params, self.loaded.facts.context_window).to_dict()

    def submit(
        self, params: GenerateParams, request_id: str | None = None, label: str = "", feed_text: bool | None = None
    ) -> RequestHandle:
        """Queue a request; raise UserError when it cannot be (bad budget, full queue, no model, or
        more KV blocks than the whole pool holds). `feed_text`: whether the feed may carry this
        request's prompt and answer (None: the server's `feed_text`), fixed when it is submitted."""
        self._require_ready()
        if params.constraint is not None:  # a grammar xgrammar refuses is a UserError naming the field, now
            compiled(params.constraint, self.loaded.tokenizer, self.loaded.facts.vocab_size)
        view = plan(self.loaded.tokenizer, params, self.loaded.facts.context_window)
        seq = Sequence(
            id=request_id or f"req-{next(self._ids)}",
            params=params,
            prompt_ids=view.ids,
            max_new_tokens=view.budget["max_new_tokens"],
            key=f"r{next(self._keys)}",
            label=label,
            feed_text=feed_text,
        )
        self._require_room(seq)
        handle = seq.stream = RequestHandle(seq, self.config.event_buffer, self._cancel)
        with self._lock:
            if self._closed is not None:  # checked under the lock: the worker may be draining now
                raise UserError(f"the model is not available: {self._closed}", code="model_failed")
            self.scheduler.add(seq)  # raises overloaded before anything is emitted
            self._announce.submitted(seq, view, self.loaded.facts.context_window)
            self._announce.positions(self.scheduler)
            self._wake.notify_all()
        return handle

    def _require_room(self, seq: Sequence) -> None:
        if not seq.uses_cache:
            return
        need = self.pool.blocks_needed(len(seq.prompt_ids) + seq.max_new_tokens)
        if need > self.pool.total_blocks:
            raise UserError(
                f"this request needs up to {need} KV blocks ({len(seq.prompt_ids)} prompt + {seq.max_new_tokens} new "
                f"tokens, {self.pool.block_size} a block) but the whole pool holds {self.pool.total_blocks}; "
                "lower `max_new_tokens`, shorten the messages, or start the server with a larger --kv-cache-mb",
                code="too_large",
                field="max_new_tokens",
            )

    def describe_ready(self) -> None:
        """Raise UserError (model_loading / model_failed) unless the model can take requests."""
        self._require_ready()

    def _require_ready(self) -> None:
        ok, why = self.health() if self._thread is not None else (True, "")
        if self._status == "loading":
            raise UserError("the model is still loading; try again in a few seconds", code="model_loading")
        if not ok or self._status != "ready":
            raise UserError(f"the model is not available: {why}", code="model_failed")

    def _cancel(self, seq: Sequence, cause: str) -> None:
        """Cancel from any thread: a waiting request ends here and now, never prefilled; a running
        one is flagged and the worker ends it (and frees its blocks) before its next model step."""
        with self._lock:
            if seq.cancel_cause is None:
                seq.cancel_cause = cause
            if self.scheduler.is_waiting(seq):
                self._end(seq, cancelled=True)
                self._announce.positions(self.scheduler)
            self._wake.notify_all()

    @property
    def policy(self) -> Policy:
        return self.scheduler.policy

    def set_policy(self, changes: dict[str, Any] | None = None, /, **more: Any) -> Policy:
        """Change scheduling policies at run time (batch-invariant mode among them); they apply from the next
        step (`_apply_policy`). UserError (naming the field and its limit) when a change is not valid."""
        with self._lock:
            policy = self.scheduler.policy.updated({**(changes or {}), **more})
            self.scheduler.policy = policy
            self._wake.notify_all()
        self._announce.policy(policy)
        return policy

    def cancel_all(self, cause: str) -> int:
        """Cancel every queued and running request (each ends with one `cancelled` event with this
        cause); returns how many were asked to stop."""
        with self._lock:
            seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
        for seq in seqs:
            self._cancel(seq, cause)
        return len(seqs)

    def batch_invariance(self) -> dict[str, Any]:
        """Whether the mode is on and, when it is, what it rests on here (for /api/model and /metrics)."""
        if not self.scheduler.policy.batch_invariant:
            return {"on": False}
        invariance = self._forwards.invariance if self._forwards is not None else None
        return invariance.to_dict() if invariance is not None else {"on": True, "claimed": None}

    def decoder(self) -> dict[str, Any] | None:
        """Which decoder runs the steps and why (local/model/decoders.py); None until the model is loaded."""
        return self._decoder

    def compiled(self, wait: bool = False) -> dict[str, Any] | None:
        """Whether the decode stretches run compiled, and why (local/model/compiled.py; with `wait`, once settled)."""
        return (self._compiled.wait() if wait else self._compiled).to_dict() if self._compiled is not None else None

    def snapshot(self) -> dict[str, Any]:
        """Counters and the pool, for health pages and observers that join late."""
        with self._lock:
            return {
                "waiting": len(self.scheduler.waiting),
                "running": len(self.scheduler.running),
                "steps": self.steps,
                "preemptions": self.preemptions,
                "prefix_hit_tokens": self.prefix_hit_tokens,
                "policy": self.scheduler.policy.to_dict(),
                "kv": self._usage,  # the worker's copy: the pool is touched by the worker only
                "decode": self._forward.report() if self._forward is not None else None,  # CUDA graphs
                "decoder": self._decoder,  # native or transformers (local/model/decoders.py)
                "batch_invariant": self.batch_invariance(),
            }

    @property
    def active(self) -> int:
        """Requests queued or running, for tests and health."""
        with self._lock:
            return len(self.scheduler)

    # ---- the worker ------------------------------------------------------------------------------

    def _worker(self) -> None:
        try:
            if self.loaded is None:
                self.loaded = load(
                    self.config.model,
                    self.config.device,
                    self.config.dtype,
                    progress=lambda msg: log.info("model: %s", msg),
                )
                self._prepare()
        except Exception as exc:  # any load failure is reported, never a silent dead page
            self._status, self._reason = "failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("model failed to load: %s", self._reason)
            return
        try:
            with torch.inference_mode():
                while True:
                    with self._lock:
                        while not self._stopping and not len(self.scheduler):
                            self._apply_policy()  # an idle engine applies a policy change too
                            self._wake.wait(timeout=0.5)
                        if self._stopping:
                            break
                    if not self.step():
                        with self._lock:  # nothing could run (all wait for blocks): wait for a change
                            # paused by the teacher: resume, cancels and submits wake it; timeouts can wait 0.25 s
                            self._wake.wait(timeout=0.25 if self.scheduler.paused else 0.01)
        except BaseException as exc:  # the worker itself broke: say so in health, fail what waits
            self._reason = f"{type(exc).__name__}: {exc}"
            log.error("engine worker died: %s", self._reason)
            raise
        finally:
            with self._lock:
                self._closed = "shutting down" if self._stopping else f"engine worker died: {self._reason}"
            self._drain("shutdown" if self._stopping else "worker_dead")

    def step(self) -> bool:
        """One engine step: schedule → run the model → postprocess. False when nothing ran."""
        with self._lock:
            self._end_cancelled_and_expired()
            self._apply_policy()
            batch = self.scheduler.schedule(self.pool)
            self._admit(batch)
        if not batch:
            return False
        t0 = time.monotonic()
        out = run_step(batch, self._forward, self.loaded, self.pool)  # a logits row per work that wants a token
        if out.failures:
            self._fail(out.failures)
        now = time.monotonic()
        step_ms = (now - t0) * 1000
        self.steps += 1
        self._post.step(batch, out.logits, now, step_ms, self._forward.take_attention())
        with self._lock:
            self._usage = self.pool.usage().to_dict()
        self._publish_step(batch, step_ms)
        return True

    def _admit(self, batch: StepPlan) -> None:
        """Count, set up and announce what the scheduler just decided: preemptions, admissions (a
        first one makes the request's working state), queue positions. Caller holds the lock."""
        for seq, freed in batch.preempted:
            self.preemptions += 1
            self._announce.preempted(seq, freed)
        for seq in batch.admitted:
            first = seq.prefill_start is None
            if first:
                self._post.begin(seq)
                self.prefix_hit_tokens += seq.prefix_hit
            self._announce.admitted(seq, first)
        self._announce.positions(self.scheduler)

    def _publish_step(self, batch: StepPlan, step_ms: float) -> None:
        # published with nobody listening too: the feed keeps the last steps for a view opened later
        with self._lock:  # the usage step() has just taken, not a second count of the pool
            usage = self._usage
            waiting, running = len(self.scheduler.waiting), len(self.scheduler.running)
        self._announce.step(self.steps, batch, step_ms, self.pool, kv=usage, waiting=waiting, running=running)

    def _apply_policy(self) -> None:
        """The policy's side in the pool and the forward, on the worker thread (the only one that touches
        them): prefix caching on or off, and batch-invariant mode's forward (its kernels checked when first
        switched on). Caller holds the lock."""
        policy = self.scheduler.policy
        if self.pool.prefix_caching != policy.prefix_caching:
            self.pool.set_prefix_caching(policy.prefix_caching)
            self._usage = self.pool.usage().to_dict()
        if policy.batch_invariant != self._forward_invariant:  # switched only on a change, never per step
            self._forward_invariant = policy.batch_invariant
            self._forward = self._forwards.of(policy)

    # ---- endings ---------------------------------------------------------------------------------

    def _end_cancelled_and_expired(self) -> None:
        """Cancels and timeouts, acted on before every step (so within one decode step). Caller
        holds the lock."""
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if seq.cancel_cause:
                self._end(seq, cancelled=True)
            elif self._timed_out(seq):
                self._end(seq, reason="timeout")

    def _timed_out(self, seq: Sequence) -> bool:
        limit = min(seq.params.timeout_s or self.config.timeout_s, self.config.timeout_s)
        return seq.ms_since_submit() > limit * 1000

    def _fail(self, failures: dict[Sequence, Exception]) -> None:
        """End the requests whose model step failed on its own; the others of the step carry on."""
        with self._lock:
            for seq, failure in failures.items():
                self._end(seq, error=("internal", f"the model step failed: {type(failure).__name__}: {failure}"))

    def _end_now(self, seq: Sequence, **how: Any) -> None:
        """`_end` from the worker's postprocess, which does not hold the lock."""
        with self._lock:
            self._end(seq, **how)

    def _end(
        self, seq: Sequence, *, cancelled: bool = False, reason: str | None = None, error: tuple[str, str] | None = None
    ) -> None:
        """Emit the request's one terminal event and give its KV blocks back. Caller holds the lock."""
        if seq.state == State.DONE:
            return
        was, freed = self.scheduler.finish(seq, self.pool)
        if freed:  # only the worker ends a request that holds blocks: the copy is current before the end is seen
            self._usage = self.pool.usage().to_dict()
        terminal = terminal_event(seq, was, time.monotonic(), cancelled=cancelled, reason=reason, error=error)
        seq.release()
        self._tell_end_listeners(seq, terminal.to_dict())  # before the client sees its end: metrics count it
        seq.stream.finish(terminal)
        self._announce.ended(seq, terminal, freed)

    def _drain(self, cause: str) -> None:
        with self._lock:
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                seq.cancel_cause = seq.cancel_cause or "shutdown"
                if cause == "shutdown":
                    self._end(seq, cancelled=True)
                else:
                    self._end(seq, error=("worker_dead", f"the engine worker stopped: {self._reason}"))
