"""A request's first and last word, built once for both engines: the `accepted` event its client
hears, the end listeners told before the client sees its end, and the engine feed's `engine_end`."""

from __future__ import annotations

import logging
from typing import Any

from model_runner.protocol import events as ev
from model_runner.shared.feed import EngineFeed
from model_runner.shared.sequence import Sequence

log = logging.getLogger("kvscope.engine")


def accepted_event(
    seq: Sequence,
    *,
    counts: tuple[int | None, int | None, int | None],
    budget: dict[str, Any],
    context_window: int | None,
    kv_cache: bool,
    prefill_chunk: int,
) -> ev.Accepted:
    """`accepted` for `seq`; counts = (prompt, content, template) tokens, None where not visible."""
    prompt_tokens, content_tokens, template_tokens = counts
    return ev.Accepted(
        request_id=seq.id,
        t_ms=seq.ms_since_submit(),
        prompt_tokens=prompt_tokens,
        content_tokens=content_tokens,
        template_tokens=template_tokens,
        max_new_tokens=seq.max_new_tokens,
        context_window=context_window,
        budget=budget,
        delivery=seq.params.delivery,
        kv_cache=kv_cache,
        prefill_chunk=prefill_chunk,
    )


def tell_end_listeners(listeners: list, seq: Sequence, terminal: dict[str, Any], failed: set[int]) -> None:
    """Call each listener with the request's terminal event; an observer's bug never reaches the
    request, and each failing listener is logged once (its id kept in `failed`)."""
    for listener in listeners:
        try:
            listener(seq, terminal)
        except Exception as exc:
            if id(listener) not in failed:
                failed.add(id(listener))
                log.warning("end listener %r failed: %s: %s", listener, type(exc).__name__, exc)


def publish_end(feed: EngineFeed, seq: Sequence, terminal: ev.Event, blocks_freed: int | None, **text: str) -> None:
    """The feed's `engine_end`: outcome, reason, who cancelled (`cause`), tokens, blocks given back
    (None where the blocks are a remote server's), and the answer's text where the feed may show it."""
    feed.publish(
        "engine_end",
        request=seq.key,
        label=seq.label,
        outcome=terminal.type,
        reason=getattr(terminal, "reason", None) or getattr(terminal, "code", None),
        cause=getattr(terminal, "cause", None),  # who cancelled: client, disconnect, timeout, teacher ...
        tokens=len(seq.output_ids),
        blocks_freed=blocks_freed,
        **text,
    )
