"""The engine's announcements: what a request hears while it is scheduled (accepted, its queue
position, preempted, prefill start, resumed) and what the engine feed tells observers (submits,
admissions, preemptions, each step's batch, each end, policy changes). Prompt and answer text go
to the feed only where the server or the request allows it."""

from __future__ import annotations

from typing import Any

from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.postprocess import push
from model_runner.local.scheduler import Scheduler, StepPlan
from model_runner.protocol import events as ev
from model_runner.shared.endings import accepted_event, publish_end
from model_runner.shared.feed import EngineFeed
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence
from model_runner.text.prompt import PromptView


class Announcer:
    def __init__(self, feed: EngineFeed, feed_text: bool):
        self.feed = feed
        self.feed_text = feed_text  # the server's choice for requests submitted without one

    def submitted(self, seq: Sequence, view: PromptView, context_window: int) -> None:
        """A request was queued: the feed shows it while it waits; its client gets `accepted`."""
        self.feed.publish(
            "engine_submit",
            request=seq.key,
            label=seq.label,
            prompt_tokens=len(seq.prompt_ids),
            **self.text_of(prompt=seq),
        )
        counts = (view.prompt_tokens, view.content_tokens, view.template_tokens)
        seq.stream.push(
            accepted_event(
                seq,
                counts=counts,
                budget=view.budget,
                context_window=context_window,
                kv_cache=seq.params.kv_cache,
                prefill_chunk=seq.params.prefill_chunk,
            )
        )

    def preempted(self, seq: Sequence, freed: int) -> None:
        push(
            seq, ev.Preempted(request_id=seq.id, t_ms=seq.ms_since_submit(), blocks_freed=freed, tokens=len(seq.tokens))
        )
        self.feed.publish("engine_preempt", request=seq.key, label=seq.label, blocks_freed=freed)

    def admitted(self, seq: Sequence, first: bool) -> None:
        """Admitted for the first time (its prefill starts) or again after a preemption (it resumes)."""
        if first:
            push(
                seq,
                ev.PrefillStart(
                    request_id=seq.id,
                    t_ms=seq.ms_since_submit(seq.prefill_start),  # the stamp metrics' queue_ms ends at
                    prompt_tokens=len(seq.prompt_ids),
                    chunk_size=seq.chunk_size,
                    cached_tokens=seq.prefix_hit,
                ),
            )
        else:
            push(seq, ev.Resumed(request_id=seq.id, t_ms=seq.ms_since_submit(), tokens=len(seq.tokens)))
        self.feed.publish(
            "engine_admit",
            request=seq.key,
            label=seq.label,
            prompt_tokens=len(seq.prompt_ids),
            cached_tokens=0 if seq.preemptions else seq.prefix_hit,
            resumed=seq.preemptions > 0,
            # a first admission: the stamp queue_ms ends at; a resumption: now
            waited_ms=round(seq.ms_since_submit(None if seq.preemptions else seq.prefill_start), 3),
            **self.text_of(prompt=seq),
        )

    def positions(self, scheduler: Scheduler) -> None:
        """A `queued` event for each waiting request whose place in line (or reason) changed."""
        for seq, position, ahead, reason in scheduler.positions():
            if seq.stream.last_position != (position, reason):
                seq.stream.last_position = (position, reason)
                event = ev.Queued(
                    request_id=seq.id, t_ms=seq.ms_since_submit(), position=position, ahead=ahead, reason=reason
                )
                push(seq, event)

    def step(
        self, number: int, batch: StepPlan, step_ms: float, pool: PagedKVPool, *, kv: Any, waiting: int, running: int
    ) -> None:
        """One step's batch for the feed, with the pool's usage (kv) and the requests waiting and running after it."""
        self.feed.publish(
            "engine_step",
            step=number,
            ms=round(step_ms, 3),
            batch_tokens=batch.tokens,
            batch=[
                {
                    "request": w.seq.key,
                    "label": w.seq.label,
                    "kind": w.kind,
                    "tokens": len(w.tokens),
                    "blocks": pool.blocks_of(w.seq) if w.seq.uses_cache else [],
                    "shared_blocks": pool.shared_blocks_of(w.seq) if w.seq.uses_cache else [],
                }
                for w in batch.work + batch.recompute
            ],
            preempted=[seq.key for seq, _ in batch.preempted],
            prefix_hit_tokens=sum(seq.prefix_hit for seq in batch.admitted if not seq.preemptions),
            kv=kv,
            waiting=waiting,
            running=running,
        )

    def ended(self, seq: Sequence, terminal: ev.Event, freed: int) -> None:
        publish_end(self.feed, seq, terminal, freed, **self.text_of(answer=seq))

    def policy(self, policy: Policy) -> None:
        self.feed.publish("engine_policy", policy=policy.to_dict())

    def text_of(self, prompt: Sequence | None = None, answer: Sequence | None = None) -> dict[str, str]:
        """Prompt or answer text for the feed, only when the server allows it, or the request
        itself was submitted with `feed_text` (the class view's "show prompts")."""
        seq = prompt if prompt is not None else answer
        allowed = seq.feed_text if seq is not None and seq.feed_text is not None else self.feed_text
        if not allowed:
            return {}
        if prompt is not None:
            return {"prompt": prompt.params.messages[-1].content}
        text = answer.text if answer is not None else ""
        return {"text": text, "answer": text}
