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
from dataclasses import dataclass
from typing import Any

import torch

from . import events as ev
from .detokenizer import IncrementalDetokenizer, display_text
from .errors import UserError
from .kv_cache import KVCache
from .loader import LoadedModel, load
from .prompt import plan
from .request import GenerateParams, Request, State
from .sampler import Choice, choose, make_generator
from .scheduler import Scheduler
from .stopping import StopChecker
from .stream import RequestHandle

log = logging.getLogger("kvscope.engine")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    max_queue: int = 64
    timeout_s: float = 120.0  # server-side limit per request, from submit
    event_buffer: int = 1024  # events a client may fall behind before it is dropped as slow


@dataclass
class _Run:
    """Per-request working state that only the worker touches."""
    handle: RequestHandle
    cache: KVCache | None = None
    detok: IncrementalDetokenizer | None = None
    stopper: StopChecker | None = None
    generator: torch.Generator | None = None
    prefill_start: float = 0.0
    token_times: list[float] | None = None
    first_text_at: float | None = None
    released_text: str = ""


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig(), loaded: LoadedModel | None = None):
        self.config = config
        self.loaded = loaded
        self.scheduler = Scheduler(config.max_queue)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._runs: dict[int, _Run] = {}
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
        request = Request(id=request_id or f"req-{next(self._ids)}", params=params)
        request.prompt_ids = view.ids
        request.max_new_tokens = view.budget["max_new_tokens"]
        handle = RequestHandle(request, self.config.event_buffer, self._cancel)
        with self._lock:
            if self._closed is not None:  # checked under the lock: the worker may be draining now
                raise UserError(f"the model is not available: {self._closed}", code="model_failed")
            self.scheduler.add(request)  # raises overloaded before anything is emitted
            self._runs[self._key(request)] = _Run(handle)
            handle.push(ev.Accepted(
                request.id, request.ms_since_submit(), view.prompt_tokens, view.content_tokens, view.template_tokens,
                request.max_new_tokens, self.loaded.facts.context_window, view.budget, params.delivery,
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

    def _cancel(self, handle: RequestHandle, cause: str) -> None:
        """Cancel from any thread: a waiting request ends here and now, never prefilled; a running
        one is flagged and the worker ends it before its next model step."""
        request = handle.request
        with self._lock:
            if request.cancel_cause is None:
                request.cancel_cause = cause
            if self.scheduler.remove_waiting(request):
                self._end(self._runs.pop(self._key(request)), "queued")
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
            request = self.scheduler.schedule()
            if request is None:
                return
            run = self._runs[self._key(request)]
            if request.state == State.PREFILL and run.cache is None and run.token_times is None:
                self._announce_positions()
        if self._should_stop_before_step(request, run):
            return
        try:
            if run.token_times is None:
                self._prefill(request, run)
            else:
                self._decode(request, run)
            self.steps += 1
        except Exception as exc:  # the request fails, the worker lives on
            log.error("model step failed for %s: %s", request.id, exc)
            log.debug("%s", traceback.format_exc())
            with self._lock:
                self._end(self._runs.pop(self._key(request)), None,
                          error=("internal", f"the model step failed: {type(exc).__name__}: {exc}"))
                self.scheduler.finish_running()

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

    def _prefill(self, request: Request, run: _Run) -> None:
        params, facts, device = request.params, self.loaded.facts, self._device()
        run.prefill_start = time.monotonic()
        run.token_times = []
        run.detok = IncrementalDetokenizer(self.loaded.tokenizer)
        run.stopper = StopChecker(eos_ids=self.loaded.tokenizer.eos_ids, stop=params.stop,
                                  max_new_tokens=request.max_new_tokens, prompt_tokens=len(request.prompt_ids),
                                  context_window=facts.context_window)
        run.generator = make_generator(params.sampling, device)
        run.cache = KVCache(self.loaded.model.config, facts) if params.kv_cache else None
        ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=device)  # [1, prompt]
        n = ids.shape[1]
        run.handle.push(ev.PrefillStart(request.id, request.ms_since_submit(), n, params.prefill_chunk))
        chunk = params.prefill_chunk or n
        for start in range(0, n, chunk):
            t0 = time.monotonic()
            logits = self._forward(ids[:, start:start + chunk], run.cache)  # [vocab]
            self._sync()
            if params.prefill_chunk:
                run.handle.push(ev.PrefillChunk(request.id, request.ms_since_submit(), start, min(n, start + chunk),
                                                (time.monotonic() - t0) * 1000, run.cache.tokens if run.cache else 0))
            if request.cancel_cause:  # a cancel between chunks stops the prefill there
                return
        choice = choose(logits, params.sampling, run.generator)
        now = time.monotonic()
        prefill_ms = (now - run.prefill_start) * 1000
        request.state = State.DECODE
        cache_tokens, measured, formula = self._cache_numbers(run)
        run.handle.push(ev.PrefillEnd(
            request.id, request.ms_since_submit(now), n, prefill_ms, n / max(prefill_ms / 1000, 1e-9),
            cache_tokens, measured, formula,
            {"id": choice.token_id, "text": display_text(self.loaded.tokenizer, choice.token_id),
             "prob": choice.prob, "candidates": self._candidates(choice)}))
        self._accept_token(request, run, choice, now, step_ms=0.0)

    def _decode(self, request: Request, run: _Run) -> None:
        device = self._device()
        if run.cache is not None:
            ids = torch.tensor([[request.output_ids[-1]]], dtype=torch.long, device=device)  # [1, 1]
        else:  # no cache: recompute every position, the cost the cache saves
            ids = torch.tensor([request.prompt_ids + request.output_ids], dtype=torch.long, device=device)  # [1, seq]
        t0 = time.monotonic()
        logits = self._forward(ids, run.cache)  # [vocab]
        self._sync()
        choice = choose(logits, request.params.sampling, run.generator)
        now = time.monotonic()
        self._accept_token(request, run, choice, now, step_ms=(now - t0) * 1000)

    def _device(self) -> torch.device:
        return torch.device(self.loaded.facts.device)

    def _cache_numbers(self, run: _Run) -> tuple[int, int, int]:
        if run.cache is None:
            return 0, 0, 0
        return run.cache.tokens, run.cache.measured_bytes(), run.cache.formula_bytes()

    def _candidates(self, choice: Choice) -> list[ev.Candidate]:
        tok = self.loaded.tokenizer
        return [ev.Candidate(i, display_text(tok, i), p) for i, p in choice.candidates]

    # ---- postprocess -----------------------------------------------------------------------------

    def _accept_token(self, request: Request, run: _Run, choice: Choice, now: float, step_ms: float) -> None:
        request.output_ids.append(choice.token_id)
        run.token_times.append(now)
        index = len(request.output_ids) - 1
        new_text = run.detok.feed(choice.token_id)
        released, reason = run.stopper.add(choice.token_id, new_text, len(request.output_ids))
        buffered = request.params.delivery == "buffered"
        if released and not buffered and run.first_text_at is None:
            run.first_text_at = now
        run.released_text += released
        cache_tokens, measured, formula = self._cache_numbers(run)
        pushed = run.handle.push(ev.Token(
            request.id, request.ms_since_submit(now), index, choice.token_id, "" if buffered else released,
            run.detok.is_pending, step_ms, cache_tokens, measured, formula, choice.prob, self._candidates(choice)))
        if not pushed and request.cancel_cause is None:
            request.cancel_cause = "slow_client"
        if reason is not None:
            with self._lock:
                self._end(self._runs.pop(self._key(request)), None, reason=reason, token_index=index)
                self.scheduler.finish_running()

    def _should_stop_before_step(self, request: Request, run: _Run) -> bool:
        """Cancel or timeout, checked before every model step (so within one decode step)."""
        state = request.state.value
        if request.cancel_cause is None and self._timed_out(request) is None:
            return False
        with self._lock:
            if request.cancel_cause:
                self._end(self._runs.pop(self._key(request)), state)
            else:
                self._end(self._runs.pop(self._key(request)), None, reason="timeout",
                          token_index=len(request.output_ids) - 1)
            self.scheduler.finish_running()
        return True

    def _timed_out(self, request: Request) -> float | None:
        limit = min(request.params.timeout_s or self.config.timeout_s, self.config.timeout_s)
        return limit if request.ms_since_submit() > limit * 1000 else None

    def _expire_waiting(self) -> None:
        for request in [r for r in self.scheduler.waiting if self._timed_out(r) is not None]:
            self.scheduler.remove_waiting(request)
            self._end(self._runs.pop(self._key(request)), None, reason="timeout", token_index=-1)

    def _metrics(self, request: Request, run: _Run, end: float) -> dict[str, Any]:
        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - request.submitted_at) * 1000, 3)
        times = run.token_times or []
        n = len(times)
        e2e = ms(end)
        ttft = ms(times[0]) if times else None
        itl = [round((b - a) * 1000, 3) for a, b in zip(times, times[1:])]
        decode_s = times[-1] - times[0] if n > 1 else 0.0
        buffered = request.params.delivery == "buffered"
        return {
            "queue_ms": ms(run.prefill_start) if run.prefill_start else e2e,
            "prefill_ms": round((times[0] - run.prefill_start) * 1000, 3) if times else None,
            "ttft_ms": ttft,
            "tpot_ms": round((e2e - ttft) / (n - 1), 3) if n > 1 else None,
            "e2e_ms": e2e,
            "decode_tokens_per_s": round((n - 1) / decode_s, 3) if decode_s > 0 else None,
            "first_text_ms": e2e if buffered and run.released_text else ms(run.first_text_at),
            "itl_ms": itl,
        }

    def _end(self, run: _Run, cancel_state: str | None, *, reason: str | None = None, token_index: int = -1,
             error: tuple[str, str] | None = None) -> None:
        """Emit the request's one terminal event and free its cache. Caller holds the lock."""
        request, now = run.handle.request, time.monotonic()
        text = run.stopper.text if run.stopper else ""
        metrics = self._metrics(request, run, now)
        t = request.ms_since_submit(now)
        if error is not None:
            terminal = ev.Error(request.id, t, error[0], error[1])
        elif cancel_state is not None:
            terminal = ev.Cancelled(request.id, t, "cancelled", request.cancel_cause or "client", cancel_state,
                                    len(request.output_ids), text, metrics)
        else:
            terminal = ev.Finished(request.id, t, reason, token_index, len(request.output_ids), text, metrics)
        run.cache = None  # free the KV tensors now, not when the handle is collected
        request.state = State.DONE
        run.handle.finish(terminal)

    def _announce_positions(self) -> None:
        for request, position, ahead in self.scheduler.positions():
            run = self._runs.get(self._key(request))
            if run is not None and run.handle.last_position != position:
                run.handle.last_position = position
                run.handle.push(ev.Queued(request.id, request.ms_since_submit(), position, ahead))

    def _drain(self, cause: str) -> None:
        with self._lock:
            for key in list(self._runs):
                run = self._runs.pop(key)
                run.handle.request.cancel_cause = run.handle.request.cancel_cause or "shutdown"
                if cause == "shutdown":
                    self._end(run, run.handle.request.state.value)
                else:
                    self._end(run, None, error=("worker_dead", f"the engine worker stopped: {self._reason}"))
            self.scheduler.waiting.clear()
            self.scheduler.running = None

    @staticmethod
    def _key(request: Request) -> int:
        return id(request)  # request ids are the clients' own and may repeat across sockets
