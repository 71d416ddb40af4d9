"""The engine: one worker thread owns the model and runs `step()` = schedule → run model →
postprocess, one request at a time; any thread may submit or cancel, and each request's events
go to its own bounded stream, so the worker never waits on a slow client. Every request ends
with exactly one terminal event (finished, cancelled or error), whatever happens."""
from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from typing import Any

import torch

from . import events as ev
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer, display_text
from .errors import UserError
from .kv_cache import KVCache
from .loader import LoadedModel, load
from .metrics import request_metrics
from .prompt import plan
from .request import GenerateParams
from .sampler import Choice, choose, make_generator
from .scheduler import Scheduler
from .sequence import Sequence
from .stopping import StopChecker
from .stream import RequestHandle

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger("kvscope.engine")


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig(), loaded: LoadedModel | None = None):
        self.config = config
        self.loaded = loaded
        self.scheduler = Scheduler(config.max_queue)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._status = "ready" if loaded else "loading"
        self._reason: str | None = None
        self._stopping = False
        self._closed: str | None = None  # why the worker takes no more requests (set under the lock)
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self.steps = 0  # model steps run, for tests and health

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._worker, name="kvscope-engine", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while self._status == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._status != "ready":
            raise RuntimeError(f"engine not ready: {self._status} {self._reason or ''}")

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def status(self) -> dict[str, Any]:
        return {"status": self._status, "reason": self._reason}

    @property
    def facts(self):
        return self.loaded.facts if self.loaded else None

    def health(self) -> tuple[bool, str]:
        if self._status == "failed":
            return False, f"model failed to load: {self._reason}"
        if self._closed is not None or self._thread is None or not self._thread.is_alive():
            return False, f"engine worker is not running: {self._closed or self._reason or 'not started'}"
        return True, self._status

    # ---- API for any thread ----------------------------------------------------------------------

    def describe_prompt(self, params: GenerateParams) -> dict[str, Any]:
        self._require_ready()
        return plan(self.loaded.tokenizer, params, self.loaded.facts.context_window).to_dict()

    def submit(self, params: GenerateParams, request_id: str | None = None) -> RequestHandle:
        """Queue a request; raise UserError when it cannot be (bad budget, full queue, no model)."""
        self._require_ready()
        view = plan(self.loaded.tokenizer, params, self.loaded.facts.context_window)
        seq = Sequence(id=request_id or f"req-{next(self._ids)}", params=params, prompt_ids=view.ids,
                       max_new_tokens=view.budget["max_new_tokens"])
        handle = seq.stream = RequestHandle(seq, self.config.event_buffer, self._cancel)
        with self._lock:
            if self._closed is not None:  # checked under the lock: the worker may be draining now
                raise UserError(f"the model is not available: {self._closed}", code="model_failed")
            self.scheduler.add(seq)  # raises overloaded before anything is emitted
            handle.push(ev.Accepted(
                seq.id, seq.ms_since_submit(), view.prompt_tokens, view.content_tokens, view.template_tokens,
                seq.max_new_tokens, self.loaded.facts.context_window, view.budget, params.delivery,
                params.kv_cache, params.prefill_chunk))
            self._announce_positions()
            self._wake.notify_all()
        return handle

    def _require_ready(self) -> None:
        ok, why = self.health() if self._thread is not None else (True, "")
        if self._status == "loading":
            raise UserError("the model is still loading; try again in a few seconds", code="model_loading")
        if not ok or self._status != "ready":
            raise UserError(f"the model is not available: {why}", code="model_failed")

    def _cancel(self, seq: Sequence, cause: str) -> None:
        """Cancel from any thread: a waiting request ends here and now, never prefilled; a running
        one is flagged and the worker ends it before its next model step."""
        with self._lock:
            if seq.cancel_cause is None:
                seq.cancel_cause = cause
            if self.scheduler.is_waiting(seq):
                self._end(seq, cancelled=True)
                self._announce_positions()
            self._wake.notify_all()

    # ---- the worker ------------------------------------------------------------------------------

    def _worker(self) -> None:
        try:
            if self.loaded is None:
                self.loaded = load(self.config.model, self.config.device, self.config.dtype,
                                   progress=lambda msg: log.info("model: %s", msg))
            self._status = "ready"
        except Exception as exc:  # any load failure is reported, never a silent dead page
            self._status, self._reason = "failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("model failed to load: %s", self._reason)
            return
        try:
            with torch.inference_mode():
                while True:
                    with self._lock:
                        while not self._stopping and not len(self.scheduler):
                            self._wake.wait(timeout=0.5)
                        if self._stopping:
                            break
                    self.step()
        except BaseException as exc:  # the worker itself broke: say so in health, fail what waits
            self._reason = f"{type(exc).__name__}: {exc}"
            log.error("engine worker died: %s", self._reason)
            raise
        finally:
            with self._lock:
                self._closed = "shutting down" if self._stopping else f"engine worker died: {self._reason}"
            self._drain("shutdown" if self._stopping else "worker_dead")

    def step(self) -> None:
        """One engine step: schedule → run the model (prefill or one decode token) → postprocess."""
        with self._lock:
            self._expire_waiting()
            seq = self.scheduler.schedule()
            if seq is None:
                return
            if not seq.started:
                self._announce_positions()
        if self._should_stop_before_step(seq):
            return
        try:
            if seq.started:
                self._decode(seq)
            else:
                self._prefill(seq)
            self.steps += 1
        except Exception as exc:  # the request fails, the worker lives on
            log.error("model step failed for %s: %s", seq.id, exc)
            log.debug("%s", traceback.format_exc())
            with self._lock:
                self._end(seq, error=("internal", f"the model step failed: {type(exc).__name__}: {exc}"))

    # ---- model work ------------------------------------------------------------------------------

    def _forward(self, input_ids: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """input_ids: [1, seq] → logits of the last position: [vocab]."""
        out = self.loaded.model(input_ids=input_ids, past_key_values=cache.cache if cache else None,
                                use_cache=cache is not None, logits_to_keep=1)
        return out.logits[0, -1]

    def _sync(self) -> None:
        device = self.loaded.facts.device
        if device == "cuda":
            torch.cuda.synchronize()
        elif device == "mps":
            torch.mps.synchronize()

    def _start(self, seq: Sequence) -> None:
        """The request's working state, made when its prefill begins."""
        params, facts = seq.params, self.loaded.facts
        seq.prefill_start = time.monotonic()
        seq.detok = IncrementalDetokenizer(self.loaded.tokenizer)
        seq.stopper = StopChecker(eos_ids=self.loaded.tokenizer.eos_ids, stop=params.stop,
                                  max_new_tokens=seq.max_new_tokens, prompt_tokens=len(seq.prompt_ids),
                                  context_window=facts.context_window)
        seq.generator = make_generator(params.sampling, self._device())
        seq.cache = KVCache(self.loaded.model.config, facts) if params.kv_cache else None

    def _prefill(self, seq: Sequence) -> None:
        self._start(seq)
        chunk_size = seq.params.prefill_chunk
        ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self._device())  # [1, prompt]
        n = ids.shape[1]
        seq.stream.push(ev.PrefillStart(seq.id, seq.ms_since_submit(), n, chunk_size))
        for start in range(0, n, chunk_size or n):
            t0 = time.monotonic()
            logits = self._forward(ids[:, start:start + (chunk_size or n)], seq.cache)  # [vocab]
            self._sync()
            if chunk_size:
                seq.stream.push(ev.PrefillChunk(seq.id, seq.ms_since_submit(), start, min(n, start + chunk_size),
                                                (time.monotonic() - t0) * 1000, seq.cache.tokens if seq.cache else 0))
            if seq.cancel_cause:  # a cancel between chunks stops the prefill there
                return
        choice = choose(logits, seq.params.sampling, seq.generator)
        now = time.monotonic()
        prefill_ms = (now - seq.prefill_start) * 1000
        self.scheduler.prefilled(seq)
        cache_tokens, measured, formula = self._cache_numbers(seq)
        seq.stream.push(ev.PrefillEnd(
            seq.id, seq.ms_since_submit(now), n, prefill_ms, n / max(prefill_ms / 1000, 1e-9),
            cache_tokens, measured, formula,
            {"id": choice.token_id, "text": display_text(self.loaded.tokenizer, choice.token_id),
             "prob": choice.prob, "candidates": self._candidates(choice)}))
        self._accept_token(seq, choice, now, step_ms=0.0)

    def _decode(self, seq: Sequence) -> None:
        device = self._device()
        if seq.cache is not None:
            ids = torch.tensor([[seq.output_ids[-1]]], dtype=torch.long, device=device)  # [1, 1]
        else:  # no cache: recompute every position, the cost the cache saves
            ids = torch.tensor([seq.prompt_ids + seq.output_ids], dtype=torch.long, device=device)  # [1, seq]
        t0 = time.monotonic()
        logits = self._forward(ids, seq.cache)  # [vocab]
        self._sync()
        choice = choose(logits, seq.params.sampling, seq.generator)
        now = time.monotonic()
        self._accept_token(seq, choice, now, step_ms=(now - t0) * 1000)

    def _device(self) -> torch.device:
        return torch.device(self.loaded.facts.device)

    @staticmethod
    def _cache_numbers(seq: Sequence) -> tuple[int, int, int]:
        if seq.cache is None:
            return 0, 0, 0
        return seq.cache.tokens, seq.cache.measured_bytes(), seq.cache.formula_bytes()

    def _candidates(self, choice: Choice) -> list[ev.Candidate]:
        tok = self.loaded.tokenizer
        return [ev.Candidate(i, display_text(tok, i), p) for i, p in choice.candidates]

    # ---- postprocess -----------------------------------------------------------------------------

    def _accept_token(self, seq: Sequence, choice: Choice, now: float, step_ms: float) -> None:
        seq.output_ids.append(choice.token_id)
        seq.token_times.append(now)
        index = len(seq.output_ids) - 1
        new_text = seq.detok.feed(choice.token_id)
        released, reason = seq.stopper.add(choice.token_id, new_text, len(seq.output_ids))
        buffered = seq.params.delivery == "buffered"
        if released and not buffered and seq.first_text_at is None:
            seq.first_text_at = now
        seq.released_text += released
        cache_tokens, measured, formula = self._cache_numbers(seq)
        pushed = seq.stream.push(ev.Token(
            seq.id, seq.ms_since_submit(now), index, choice.token_id, "" if buffered else released,
            seq.detok.is_pending, step_ms, cache_tokens, measured, formula, choice.prob, self._candidates(choice)))
        if not pushed and seq.cancel_cause is None:
            seq.cancel_cause = "slow_client"
        if reason is not None:
            with self._lock:
                self._end(seq, reason=reason)

    def _should_stop_before_step(self, seq: Sequence) -> bool:
        """Cancel or timeout, checked before every model step (so within one decode step)."""
        if seq.cancel_cause is None and not self._timed_out(seq):
            return False
        with self._lock:
            if seq.cancel_cause:
                self._end(seq, cancelled=True)
            else:
                self._end(seq, reason="timeout")
        return True

    def _timed_out(self, seq: Sequence) -> bool:
        limit = min(seq.params.timeout_s or self.config.timeout_s, self.config.timeout_s)
        return seq.ms_since_submit() > limit * 1000

    def _expire_waiting(self) -> None:
        for seq in [s for s in self.scheduler.waiting if self._timed_out(s)]:
            self._end(seq, reason="timeout")

    def _end(self, seq: Sequence, *, cancelled: bool = False, reason: str | None = None,
             error: tuple[str, str] | None = None) -> None:
        """Emit the request's one terminal event and free its cache. Caller holds the lock."""
        was = self.scheduler.finish(seq).value
        now = time.monotonic()
        metrics, t = request_metrics(seq, now), seq.ms_since_submit(now)
        if error is not None:
            terminal = ev.Error(seq.id, t, error[0], error[1])
        elif cancelled:
            terminal = ev.Cancelled(seq.id, t, "cancelled", seq.cancel_cause or "client", was,
                                    len(seq.output_ids), seq.text, metrics)
        else:
            terminal = ev.Finished(seq.id, t, reason, len(seq.output_ids) - 1, len(seq.output_ids), seq.text, metrics)
        seq.release()
        seq.stream.finish(terminal)

    def _announce_positions(self) -> None:
        for seq, position, ahead in self.scheduler.positions():
            if seq.stream.last_position != position:
                seq.stream.last_position = position
                seq.stream.push(ev.Queued(seq.id, seq.ms_since_submit(), position, ahead))

    def _drain(self, cause: str) -> None:
        with self._lock:
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                seq.cancel_cause = seq.cancel_cause or "shutdown"
                if cause == "shutdown":
                    self._end(seq, cancelled=True)
                else:
                    self._end(seq, error=("worker_dead", f"the engine worker stopped: {self._reason}"))

    @property
    def active(self) -> int:
        """Requests queued or running, for tests and health."""
        with self._lock:
            return len(self.scheduler)
