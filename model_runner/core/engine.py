"""The engine: one worker thread owns the model and the paged KV pool and runs `step()` =
schedule → one batched forward (a decode token for each running request plus prefill chunks of
newly admitted ones) → postprocess (sample per request, stop checks, events). Any thread may
submit, cancel or change the scheduling policy; each request's events go to its own bounded
stream and the engine feed goes to observers, so the worker never waits on a slow reader. Every
request ends with exactly one terminal event (finished, cancelled or error), whatever happens."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Any

import torch

from model_runner import events as ev
from model_runner.core.config import EngineConfig
from model_runner.core.feed import EngineFeed
from model_runner.core.forward import BatchForward, recompute_forward
from model_runner.core.kv_cache import PagedKVPool, blocks_for_megabytes, default_blocks
from model_runner.core.scheduler import Policy, Scheduler, StepPlan, Work
from model_runner.core.sequence import Sequence, State
from model_runner.core.stream import RequestHandle
from model_runner.errors import UserError
from model_runner.loading.loader import LoadedModel, load
from model_runner.metrics import request_metrics
from model_runner.request import GenerateParams
from model_runner.text.detokenizer import IncrementalDetokenizer, display_text
from model_runner.text.prompt import plan
from model_runner.text.sampler import Choice, choose, make_generator
from model_runner.text.stopping import StopChecker

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger("kvscope.engine")


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig(), loaded: LoadedModel | None = None):
        self.config = config
        self.loaded = loaded
        self.scheduler = Scheduler(config.max_queue, config.policy)
        self.feed = EngineFeed()
        self.pool: PagedKVPool | None = None
        self._usage: dict[str, int] | None = None  # the pool's usage after the last step (read by any thread)
        self._forward: BatchForward | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._status, self._reason = "loading", None
        self._stopping = False
        self._closed: str | None = None  # why the worker takes no more requests (set under the lock)
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._keys = itertools.count(1)
        self.steps = 0  # model steps run, for tests and health
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self.tokens_generated = 0  # every token chosen, in all (the class view's tokens/s)
        self._end_listeners: list = []  # fn(sequence, terminal event dict), see add_end_listener
        if loaded is not None:
            self._prepare()

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

    @property
    def local(self) -> "Engine":
        """This engine runs the model here: it is its own `LocalControls` (model_runner/interface.py)."""
        return self

    def health(self) -> tuple[bool, str]:
        if self._status == "failed":
            return False, f"model failed to load: {self._reason}"
        if self._closed is not None or self._thread is None or not self._thread.is_alive():
            return False, f"engine worker is not running: {self._closed or self._reason or 'not started'}"
        return True, self._status

    def _prepare(self) -> None:
        """The paged pool and the batched forward, once the model is loaded."""
        facts, size = self.loaded.facts, self.config.block_size
        blocks = (
            blocks_for_megabytes(self.config.kv_cache_mb, facts, size)
            if self.config.kv_cache_mb is not None
            else default_blocks(facts, size)
        )
        self.pool = PagedKVPool(self.loaded.model, facts, blocks, size, self.scheduler.policy.max_batch_tokens)
        self.pool.set_prefix_caching(self.scheduler.policy.prefix_caching)
        self._forward = BatchForward(self.loaded.model, self.pool)
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
            self.feed.publish(  # so observers can show a request while it waits
                "engine_submit",
                request=seq.key,
                label=seq.label,
                prompt_tokens=len(seq.prompt_ids),
                **self._feed_text(prompt=seq),
            )
            handle.push(
                ev.Accepted(
                    seq.id,
                    seq.ms_since_submit(),
                    view.prompt_tokens,
                    view.content_tokens,
                    view.template_tokens,
                    seq.max_new_tokens,
                    self.loaded.facts.context_window,
                    view.budget,
                    params.delivery,
                    params.kv_cache,
                    params.prefill_chunk,
                )
            )
            self._announce_positions()
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
                self._announce_positions()
            self._wake.notify_all()

    @property
    def policy(self) -> Policy:
        return self.scheduler.policy

    def set_policy(self, changes: dict[str, Any] | None = None, /, **more: Any) -> Policy:
        """Change scheduling policies at run time; they apply from the next step. UserError (naming
        the field and its limit) when a change is not valid."""
        with self._lock:
            policy = self.scheduler.policy.updated({**(changes or {}), **more})
            self.scheduler.policy = policy
            self._wake.notify_all()
        self.feed.publish("engine_policy", policy=policy.to_dict())
        return policy

    def set_paused(self, paused: bool) -> None:
        """Hold (or release) admissions: requests are still accepted and queued, and those running
        carry on, but nothing waiting is admitted while paused (the class view's pause)."""
        with self._lock:
            self.scheduler.paused = bool(paused)
            self._wake.notify_all()

    @property
    def paused(self) -> bool:
        return self.scheduler.paused

    @contextmanager
    def admissions_held(self):
        """Nothing is admitted inside this block, so requests queued in it are first seen together (an
        experiment's batch); unlike the teacher's pause it can neither undo nor be undone by that."""
        with self._lock:
            self.scheduler.held += 1
        try:
            yield
        finally:
            with self._lock:
                self.scheduler.held -= 1
                self._wake.notify_all()

    def withdraw_feed_text(self) -> None:
        """The teacher turned "show prompts" off: requests still queued or running stop carrying their
        prompt and answer text in the feed from now on (their flag was fixed when they were sent)."""
        with self._lock:
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                seq.feed_text = False

    def cancel_all(self, cause: str) -> int:
        """Cancel every queued and running request (each ends with one `cancelled` event with this
        cause); returns how many were asked to stop."""
        with self._lock:
            seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
        for seq in seqs:
            self._cancel(seq, cause)
        return len(seqs)

    def add_end_listener(self, fn) -> None:
        """Call fn(sequence, terminal event dict) once per request, at its end. It runs on the thread
        that ended the request with the engine lock held: it must be quick, must not call back into
        the engine, and whatever it raises is logged, never passed on."""
        self._end_listeners.append(fn)

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
                            self._apply_pool_policy()  # an idle engine applies a policy change too
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
            self._apply_pool_policy()
            batch = self.scheduler.schedule(self.pool)
            self._announce_schedule(batch)
        if not batch:
            return False
        t0 = time.monotonic()
        cached = {id(w): w.seq.cached for w in batch.work}  # to undo a failed step's bookkeeping
        try:
            logits = self._run(batch)  # one [vocab] row per work item that wants a token
        except Exception as exc:
            for work in batch.work:
                work.seq.cached = cached[id(work)]
            logits = self._isolate_failure(batch, exc)
        now = time.monotonic()
        step_ms = (now - t0) * 1000
        self.steps += 1
        self._postprocess(batch, logits, now, step_ms)
        with self._lock:
            self._usage = self.pool.usage().to_dict()
        self._publish_step(batch, step_ms)
        return True

    def _apply_pool_policy(self) -> None:
        """The pool's side of the policy, on the worker thread (the only one that touches the pool)."""
        if self.pool.prefix_caching != self.scheduler.policy.prefix_caching:
            self.pool.set_prefix_caching(self.scheduler.policy.prefix_caching)
            self._usage = self.pool.usage().to_dict()

    # ---- model work ------------------------------------------------------------------------------

    def _run(self, batch: StepPlan) -> dict[int, torch.Tensor]:
        """The step's forward passes → {id(work): logits row [vocab]} for the work that wants a token."""
        rows: dict[int, torch.Tensor] = {}
        if batch.work:
            completing = [self.pool.completing(w.seq, len(w.tokens)) for w in batch.work]
            logits = self._forward(batch.work)  # [wanting rows, vocab]
            for work, complete in zip(batch.work, completing):
                self.pool.completed(work.seq, complete)
            wanting = [w for w in batch.work if w.wants_logits]
            rows.update({id(w): logits[i] for i, w in enumerate(wanting)})
        for work in batch.recompute:
            rows[id(work)] = recompute_forward(self.loaded.model, work.seq)[0]
        self._sync()
        return rows

    def _isolate_failure(self, batch: StepPlan, exc: Exception) -> dict[int, torch.Tensor]:
        """A batched forward failed: run each request of the step alone, so only the ones that fail
        on their own end with an error and the others carry on (the worker lives on either way)."""
        log.error("model step failed: %s", exc)
        log.debug("%s", traceback.format_exc())
        alone = [StepPlan(work=[w]) for w in batch.work] + [StepPlan(recompute=[w]) for w in batch.recompute]
        rows: dict[int, torch.Tensor] = {}
        failures: dict[Sequence, Exception] = {}
        for single in alone:
            seq = (single.work + single.recompute)[0].seq
            cached = seq.cached
            try:
                if len(alone) == 1:
                    raise exc
                rows.update(self._run(single))
            except Exception as failure:
                seq.cached = cached
                failures[seq] = failure
        with self._lock:
            for seq, failure in failures.items():
                self._end(seq, error=("internal", f"the model step failed: {type(failure).__name__}: {failure}"))
        return rows

    def _sync(self) -> None:
        device = self.loaded.facts.device
        if device == "cuda":
            torch.cuda.synchronize()
        elif device == "mps":
            torch.mps.synchronize()

    def _begin(self, seq: Sequence) -> None:
        """The request's working state, made when it is first admitted."""
        params, facts = seq.params, self.loaded.facts
        seq.prefill_start = time.monotonic()
        seq.detok = IncrementalDetokenizer(self.loaded.tokenizer)
        seq.stopper = StopChecker(
            eos_ids=self.loaded.tokenizer.eos_ids,
            stop=params.stop,
            max_new_tokens=seq.max_new_tokens,
            prompt_tokens=len(seq.prompt_ids),
            context_window=facts.context_window,
        )
        seq.generator = make_generator(params.sampling, torch.device(facts.device))

    def _cache_numbers(self, seq: Sequence) -> dict[str, int]:
        if not seq.uses_cache:
            return {"cache_tokens": 0, "measured": 0, "formula": 0, "kv_blocks": 0, "kv_bytes_reserved": 0}
        blocks = len(self.pool.blocks_of(seq))
        return {
            "cache_tokens": seq.cached,
            "measured": self.pool.measured_bytes(seq.cached),
            "formula": self.pool.formula_bytes(seq.cached),
            "kv_blocks": blocks,
            "kv_bytes_reserved": blocks * self.pool.bytes_per_block,
        }

    def _candidates(self, choice: Choice) -> list[ev.Candidate]:
        tok = self.loaded.tokenizer
        return [ev.Candidate(i, display_text(tok, i), p) for i, p in choice.candidates]

    # ---- postprocess -----------------------------------------------------------------------------

    def _postprocess(self, batch: StepPlan, logits: dict[int, torch.Tensor], now: float, step_ms: float) -> None:
        size = len(batch.work) + len(batch.recompute)
        for work in batch.work + batch.recompute:
            if work.seq.state == State.DONE:  # ended by a failure or a race in this step: nothing more to say
                continue
            try:
                self._postprocess_one(work, logits, now, step_ms, size)
            except Exception as exc:  # one request's failure (sampling, detokenizing) ends it alone
                log.error("postprocessing %s failed: %s", work.seq.id, exc)
                log.debug("%s", traceback.format_exc())
                with self._lock:
                    self._end(
                        work.seq, error=("internal", f"choosing the next token failed: {type(exc).__name__}: {exc}")
                    )

    def _postprocess_one(
        self, work: Work, logits: dict[int, torch.Tensor], now: float, step_ms: float, size: int
    ) -> None:
        seq = work.seq
        if work.kind == "prefill" and work.chunked and not seq.preemptions:  # a resume recomputes, silently
            done = seq.cached  # the chunk's end: the forward has just stored it
            self._push(
                seq,
                ev.PrefillChunk(seq.id, seq.ms_since_submit(now), done - len(work.tokens), done, step_ms, seq.cached),
            )
        if not work.wants_logits:
            return
        choice = choose(logits[id(work)], seq.params.sampling, seq.generator)
        if work.kind == "prefill" and not seq.output_ids:
            self._end_prefill(seq, choice, now, size)
            self._accept_token(seq, choice, now, 0.0, size)
            return
        if work.kind == "prefill":  # a resumed request's recompute: it decodes again from here
            self.scheduler.prefilled(seq)
        self._accept_token(seq, choice, now, step_ms, size)

    def _end_prefill(self, seq: Sequence, choice: Choice, now: float, batch_size: int) -> None:
        self.scheduler.prefilled(seq)
        prefill_ms = (now - seq.prefill_start) * 1000
        n, kv = len(seq.prompt_ids), self._cache_numbers(seq)
        self._push(
            seq,
            ev.PrefillEnd(
                seq.id,
                seq.ms_since_submit(now),
                n,
                prefill_ms,
                n / max(prefill_ms / 1000, 1e-9),
                kv["cache_tokens"],
                kv["measured"],
                kv["formula"],
                {
                    "id": choice.token_id,
                    "text": display_text(self.loaded.tokenizer, choice.token_id),
                    "prob": choice.prob,
                    "candidates": self._candidates(choice),
                },
                kv["kv_blocks"],
                kv["kv_bytes_reserved"],
                batch_size,
            ),
        )

    def _accept_token(self, seq: Sequence, choice: Choice, now: float, step_ms: float, batch_size: int) -> None:
        seq.output_ids.append(choice.token_id)
        seq.token_times.append(now)
        self.tokens_generated += 1
        index = len(seq.output_ids) - 1
        new_text = seq.detok.feed(choice.token_id)
        released, reason = seq.stopper.add(choice.token_id, new_text, len(seq.output_ids))
        buffered = seq.params.delivery == "buffered"
        if released and not buffered and seq.first_text_at is None:
            seq.first_text_at = now
        seq.released_text += released
        kv = self._cache_numbers(seq)
        self._push(
            seq,
            ev.Token(
                seq.id,
                seq.ms_since_submit(now),
                index,
                choice.token_id,
                "" if buffered else released,
                seq.detok.is_pending,
                step_ms,
                kv["cache_tokens"],
                kv["measured"],
                kv["formula"],
                choice.prob,
                self._candidates(choice),
                kv["kv_blocks"],
                kv["kv_bytes_reserved"],
                batch_size,
            ),
        )
        if reason is not None:
            with self._lock:
                self._end(seq, reason=reason)

    # ---- scheduling events -----------------------------------------------------------------------

    @staticmethod
    def _push(seq: Sequence, event: ev.Event) -> None:
        """Queue an event for the request's client; one that fell too far behind is cancelled as
        slow (before the next step), so it never sees a stream with a hole in it."""
        if not seq.stream.push(event) and seq.cancel_cause is None:
            seq.cancel_cause = "slow_client"

    def _announce_schedule(self, batch: StepPlan) -> None:
        """Events for what the scheduler just decided: preemptions, admissions, queue positions."""
        for seq, freed in batch.preempted:
            self.preemptions += 1
            self._push(seq, ev.Preempted(seq.id, seq.ms_since_submit(), freed, len(seq.tokens)))
            self.feed.publish("engine_preempt", request=seq.key, label=seq.label, blocks_freed=freed)
        for seq in batch.admitted:
            if seq.prefill_start is None:
                self._begin(seq)
                self.prefix_hit_tokens += seq.prefix_hit
                self._push(
                    seq,
                    ev.PrefillStart(
                        # the same clock reading as metrics' queue_ms, so queue + prefill = TTFT
                        seq.id,
                        seq.ms_since_submit(seq.prefill_start),
                        len(seq.prompt_ids),
                        seq.chunk_size,
                        seq.prefix_hit,
                    ),
                )
            else:
                self._push(seq, ev.Resumed(seq.id, seq.ms_since_submit(), len(seq.tokens)))
            self.feed.publish(
                "engine_admit",
                request=seq.key,
                label=seq.label,
                prompt_tokens=len(seq.prompt_ids),
                cached_tokens=0 if seq.preemptions else seq.prefix_hit,
                resumed=seq.preemptions > 0,
                # a first admission: the stamp queue_ms ends at; a resumption: now
                waited_ms=round(seq.ms_since_submit(None if seq.preemptions else seq.prefill_start), 3),
                **self._feed_text(prompt=seq),
            )
        self._announce_positions()

    def _announce_positions(self) -> None:
        for seq, position, ahead, reason in self.scheduler.positions():
            if seq.stream.last_position != (position, reason):
                seq.stream.last_position = (position, reason)
                self._push(seq, ev.Queued(seq.id, seq.ms_since_submit(), position, ahead, reason))

    def _publish_step(self, batch: StepPlan, step_ms: float) -> None:
        if not self.feed.subscribers:
            return
        with self._lock:  # the usage step() has just taken, not a second count of the pool
            usage = self._usage
            waiting, running = len(self.scheduler.waiting), len(self.scheduler.running)
        self.feed.publish(
            "engine_step",
            step=self.steps,
            ms=round(step_ms, 3),
            batch_tokens=batch.tokens,
            batch=[
                {
                    "request": w.seq.key,
                    "label": w.seq.label,
                    "kind": w.kind,
                    "tokens": len(w.tokens),
                    "blocks": self.pool.blocks_of(w.seq) if w.seq.uses_cache else [],
                    "shared_blocks": self.pool.shared_blocks_of(w.seq) if w.seq.uses_cache else [],
                }
                for w in batch.work + batch.recompute
            ],
            preempted=[seq.key for seq, _ in batch.preempted],
            prefix_hit_tokens=sum(seq.prefix_hit for seq in batch.admitted if not seq.preemptions),
            kv=usage,
            waiting=waiting,
            running=running,
        )

    def _feed_text(self, prompt: Sequence | None = None, answer: Sequence | None = None) -> dict[str, str]:
        """Prompt or answer text for the feed, only when the server allows it, or the request
        itself was submitted with `feed_text` (the class view's "show prompts")."""
        seq = prompt if prompt is not None else answer
        allowed = seq.feed_text if seq is not None and seq.feed_text is not None else self.config.feed_text
        if not allowed:
            return {}
        if prompt is not None:
            return {"prompt": prompt.params.messages[-1].content}
        text = answer.text if answer is not None else ""
        return {"text": text, "answer": text}

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

    def _end(
        self, seq: Sequence, *, cancelled: bool = False, reason: str | None = None, error: tuple[str, str] | None = None
    ) -> None:
        """Emit the request's one terminal event and give its KV blocks back. Caller holds the lock."""
        if seq.state == State.DONE:
            return
        was, freed = self.scheduler.finish(seq, self.pool)
        if freed:  # only the worker ends a request that holds blocks: the copy is current before the end is seen
            self._usage = self.pool.usage().to_dict()
        now = time.monotonic()
        metrics, t = request_metrics(seq, now), seq.ms_since_submit(now)
        if error is not None:
            terminal = ev.Error(seq.id, t, error[0], error[1])
        elif cancelled:
            terminal = ev.Cancelled(
                seq.id, t, "cancelled", seq.cancel_cause or "client", was.value, len(seq.output_ids), seq.text, metrics
            )
        else:
            terminal = ev.Finished(seq.id, t, reason, len(seq.output_ids) - 1, len(seq.output_ids), seq.text, metrics)
        seq.release()
        for listener in self._end_listeners:  # before the client sees its end, so metrics already count it
            try:
                listener(seq, terminal.to_dict())
            except Exception:  # an observer's bug never reaches the worker
                log.exception("end listener failed")
        seq.stream.finish(terminal)
        self.feed.publish(
            "engine_end",
            request=seq.key,
            label=seq.label,
            outcome=terminal.type,
            reason=getattr(terminal, "reason", None) or getattr(terminal, "code", None),
            cause=getattr(terminal, "cause", None),  # who cancelled: client, disconnect, timeout, teacher ...
            tokens=len(seq.output_ids),
            blocks_freed=freed,
            **self._feed_text(answer=seq),
        )

    def _drain(self, cause: str) -> None:
        with self._lock:
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                seq.cancel_cause = seq.cancel_cause or "shutdown"
                if cause == "shutdown":
                    self._end(seq, cancelled=True)
                else:
                    self._end(seq, error=("worker_dead", f"the engine worker stopped: {self._reason}"))
