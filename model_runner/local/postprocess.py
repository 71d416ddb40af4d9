"""Postprocess, the last part of an engine step: for each request in the step, choose its next token
from the logits, check its stop conditions, detokenize, and push the step's events (prefill chunk,
prefill end, token); also each request's working state when it is first admitted and its one
terminal event. Runs on the engine's worker thread (terminal events: on whichever thread ends it)."""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from typing import Callable

import torch

from model_runner.loading.loader import LoadedModel
from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.scheduler import Scheduler, StepPlan, Work
from model_runner.protocol import events as ev
from model_runner.protocol.metrics import request_metrics
from model_runner.shared.constraints import Guide, compiled
from model_runner.shared.sequence import Sequence, State
from model_runner.text.detokenizer import IncrementalDetokenizer, display_text
from model_runner.text.sampler import Choice, adjust, choose, make_generator
from model_runner.text.stopping import StopChecker

log = logging.getLogger("kvscope.engine")

# Ends a request with its one terminal event, taking the engine's lock: end(seq, reason=...) or
# end(seq, error=(code, message)).
EndRequest = Callable[..., None]
NO_CACHE = {"cache_tokens": 0, "measured": 0, "formula": 0, "kv_blocks": 0, "kv_bytes_reserved": 0}


def push(seq: Sequence, event: ev.Event) -> None:
    """Queue an event for the request's client; one that fell too far behind is cancelled as
    slow (before the next step), so it never sees a stream with a hole in it."""
    if not seq.stream.push(event) and seq.cancel_cause is None:
        seq.cancel_cause = "slow_client"


def terminal_event(
    seq: Sequence, was: State, now: float, *, cancelled: bool, reason: str | None, error: tuple[str, str] | None
) -> ev.Event:
    """The request's one terminal event: an error, a cancel (in the state `was`), or a finish."""
    t = seq.ms_since_submit(now)
    if error is not None:
        return ev.Error(request_id=seq.id, t_ms=t, code=error[0], message=error[1])
    metrics = request_metrics(seq, now)
    tokens = len(seq.output_ids)
    if cancelled:
        return ev.Cancelled(
            request_id=seq.id,
            t_ms=t,
            reason="cancelled",
            cause=seq.cancel_cause or "client",
            state=was.value,
            tokens=tokens,
            text=seq.text,
            metrics=metrics,
        )
    return ev.Finished(
        request_id=seq.id, t_ms=t, reason=reason, token_index=tokens - 1, tokens=tokens, text=seq.text, metrics=metrics
    )


class Postprocess:
    """Turns one step's logits into each request's next token and events."""

    def __init__(self, loaded: LoadedModel, pool: PagedKVPool, scheduler: Scheduler, end: EndRequest):
        self.loaded = loaded
        self.pool = pool
        self.scheduler = scheduler
        self._end = end
        self.tokens_generated = 0  # every token chosen, in all (the class view's tokens/s)
        self._attention: dict[int, dict] = {}  # this step's attention summaries, id(work) → summary

    def begin(self, seq: Sequence) -> None:
        """The request's working state, made when it is first admitted (its prefill starts now)."""
        params, facts = seq.params, self.loaded.facts
        seq.prefill_start = time.monotonic()
        seq.detok = IncrementalDetokenizer(self.loaded.tokenizer)
        seq.stopper = StopChecker(
            eos_ids=frozenset() if params.ignore_eos else self.loaded.tokenizer.eos_ids,
            stop=() if params.min_new_tokens else params.stop,  # stop strings count from min_new_tokens on
            max_new_tokens=seq.max_new_tokens,
            prompt_tokens=len(seq.prompt_ids),
            context_window=facts.context_window,
        )
        seq.generator = make_generator(params.sampling, torch.device(facts.device))
        if params.constraint is not None:  # compiled when the request was parsed: a cache hit here
            seq.guide = Guide(compiled(params.constraint, self.loaded.tokenizer, facts.vocab_size), facts.vocab_size)

    def step(
        self,
        batch: StepPlan,
        logits: dict[int, torch.Tensor],
        now: float,
        step_ms: float,
        attention: dict[int, dict] | None = None,
    ) -> None:
        """Postprocess every request of the step; one that fails here ends alone with an error.
        attention: id(work) → the summary of what its query read, for inspected requests."""
        self._attention = attention or {}
        size = len(batch.work) + len(batch.recompute)
        for work in batch.work + batch.recompute:
            if work.seq.state == State.DONE:  # ended by a failure or a race in this step: nothing more to say
                continue
            try:
                self._one(work, logits, now, step_ms, size)
            except Exception as exc:  # one request's failure (sampling, detokenizing) ends it alone
                log.error("postprocessing %s failed: %s", work.seq.id, exc)
                log.debug("%s", traceback.format_exc())
                self._end(work.seq, error=("internal", f"choosing the next token failed: {type(exc).__name__}: {exc}"))

    def _one(self, work: Work, logits: dict[int, torch.Tensor], now: float, step_ms: float, size: int) -> None:
        seq = work.seq
        if work.kind == "prefill" and work.chunked and not seq.preemptions:  # a resume recomputes, silently
            self._chunk_done(work, now, step_ms)
        if not work.wants_logits:
            return
        choice = self._choose(seq, logits[id(work)])
        if work.kind == "prefill" and not seq.output_ids:
            self._end_prefill(seq, choice, now, size)
            self._accept_token(seq, choice, now, 0.0, size, self._attention.get(id(work)))
            return
        if work.kind == "prefill":  # a resumed request's recompute: it decodes again from here
            self.scheduler.prefilled(seq)
        self._accept_token(seq, choice, now, step_ms, size, self._attention.get(id(work)))

    def _choose(self, seq: Sequence, logits: torch.Tensor) -> Choice:
        """The next token from the request's adjusted logits (penalties, bias; before `min_new_tokens` the
        end tokens cannot be chosen, vLLM's min_tokens), with the alternatives the request asked for."""
        params = seq.params
        early = len(seq.output_ids) < params.min_new_tokens
        banned = tuple(self.loaded.tokenizer.eos_ids) if early else ()
        logits = adjust(logits.float().cpu(), params.sampling, seq.prompt_ids, seq.output_ids, banned)
        if seq.guide is not None:  # the grammar's mask, before the choice: a forbidden token is never drawn
            logits = seq.guide.apply(logits)
        choice = choose(logits, params.sampling, seq.generator)
        if len(choice.candidates) == params.candidates:
            return choice
        return dataclasses.replace(choice, candidates=choice.candidates[: params.candidates])

    def _chunk_done(self, work: Work, now: float, step_ms: float) -> None:
        seq = work.seq
        done = seq.cached  # the chunk's end: the forward has just stored it
        push(
            seq,
            ev.PrefillChunk(
                request_id=seq.id,
                t_ms=seq.ms_since_submit(now),
                start=done - len(work.tokens),
                end=done,
                ms=step_ms,
                cache_tokens=seq.cached,
            ),
        )

    def _end_prefill(self, seq: Sequence, choice: Choice, now: float, batch_size: int) -> None:
        self.scheduler.prefilled(seq)
        prefill_ms = (now - seq.prefill_start) * 1000
        n, kv = len(seq.prompt_ids), self.cache_numbers(seq)
        first_token = {
            "id": choice.token_id,
            "text": display_text(self.loaded.tokenizer, choice.token_id),
            "prob": choice.prob,
            "candidates": self._candidates(choice),
        }
        push(
            seq,
            ev.PrefillEnd(
                request_id=seq.id,
                t_ms=seq.ms_since_submit(now),
                tokens=n,
                ms=prefill_ms,
                tokens_per_s=n / max(prefill_ms / 1000, 1e-9),
                cache_tokens=kv["cache_tokens"],
                cache_bytes_measured=kv["measured"],
                cache_bytes_formula=kv["formula"],
                first_token=first_token,
                kv_blocks=kv["kv_blocks"],
                kv_bytes_reserved=kv["kv_bytes_reserved"],
                batch_size=batch_size,
            ),
        )

    def _accept_token(
        self, seq: Sequence, choice: Choice, now: float, step_ms: float, batch_size: int, attention: dict | None
    ) -> None:
        seq.output_ids.append(choice.token_id)
        if seq.guide is not None:
            seq.guide.accept(choice.token_id)
        if len(seq.output_ids) == seq.params.min_new_tokens:  # from here on, stop strings end the answer
            seq.stopper.stop = seq.params.stop
        seq.token_times.append(now)
        self.tokens_generated += 1
        new_text = seq.detok.feed(choice.token_id)
        released, reason = seq.stopper.add(choice.token_id, new_text, len(seq.output_ids))
        buffered = seq.params.delivery == "buffered"
        if released and not buffered and seq.first_text_at is None:
            seq.first_text_at = now
        seq.released_text += released
        kv = self.cache_numbers(seq)
        if attention is not None:
            push(
                seq,
                ev.Attention(
                    request_id=seq.id, t_ms=seq.ms_since_submit(now), index=len(seq.output_ids) - 1, **attention
                ),
            )
        push(
            seq,
            ev.Token(
                request_id=seq.id,
                t_ms=seq.ms_since_submit(now),
                index=len(seq.output_ids) - 1,
                id=choice.token_id,
                text="" if buffered else released,
                pending=seq.detok.is_pending,
                step_ms=step_ms,
                cache_tokens=kv["cache_tokens"],
                cache_bytes_measured=kv["measured"],
                cache_bytes_formula=kv["formula"],
                prob=choice.prob,
                candidates=self._candidates(choice),
                kv_blocks=kv["kv_blocks"],
                kv_bytes_reserved=kv["kv_bytes_reserved"],
                batch_size=batch_size,
                mask=seq.guide.last.to_dict() if seq.guide is not None else None,
            ),
        )
        if reason is not None:
            self._end(seq, reason=reason)

    def cache_numbers(self, seq: Sequence) -> dict[str, int]:
        """The request's KV cache now: positions, bytes (measured and by formula), blocks held."""
        if not seq.uses_cache:
            return dict(NO_CACHE)
        blocks = len(self.pool.blocks_of(seq))
        return {
            "cache_tokens": seq.cached,
            "measured": self.pool.held_bytes(seq),  # read from the pool: block table × each layer's K/V row bytes
            "formula": self.pool.formula_bytes(seq.cached),
            "kv_blocks": blocks,
            "kv_bytes_reserved": blocks * self.pool.bytes_per_block,
        }

    def _candidates(self, choice: Choice) -> list[ev.Candidate]:
        tok = self.loaded.tokenizer
        return [ev.Candidate(id=i, text=display_text(tok, i), prob=p) for i, p in choice.candidates]
