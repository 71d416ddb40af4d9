"""One request in flight on the remote server, and the translation of its streamed answer (the SSE
chunks of /v1/chat/completions) into kvscope events: one `token` per token the server reports,
stamped by kvscope's clock; what the server does not send (token ids, cache bytes, KV blocks,
batch size) is None, never invented. A malformed chunk raises RemoteFailure naming what was sent."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from model_runner.protocol import events as ev
from model_runner.protocol.metrics import request_metrics
from model_runner.remote.http import Connection, RemoteFailure
from model_runner.shared.sequence import Sequence
from model_runner.shared.stream import RequestHandle

STOP_REASONS = {"length": "max_tokens", "stop": "eos"}  # OpenAI finish_reason → kvscope's


class RemoteRequest:
    """Its sequence, handle, upstream connection, the answer so far and how it ended."""

    def __init__(
        self, seq: Sequence, handle: RequestHandle, prompt_tokens: int | None, root: str, kv_bytes_per_token: int | None
    ):
        self.seq, self.handle, self.prompt_tokens = seq, handle, prompt_tokens
        self.root = root  # the server, for messages
        self.kv_bytes_per_token = kv_bytes_per_token  # from the model's config, when kvscope has it
        self.conn: Connection | None = None
        self.lock = threading.Lock()
        self.ended = False
        self.text = ""
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None  # kvscope's finish reason, once the server sent one

    def take_chunk(self, data: str) -> None:
        """One SSE `data:` payload (not "[DONE]"): usage, tokens and the finish reason it carries."""
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteFailure(
                "remote_malformed", f"the remote server at {self.root} sent a chunk that is not JSON: {data[:80]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise RemoteFailure("remote_malformed", f"the remote server at {self.root} sent {data[:80]!r}")
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise RemoteFailure(
                str(error.get("code") or "remote_error"),
                f"the remote server at {self.root} stopped with an error: {error.get('message')}",
            )
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
            raise RemoteFailure("remote_malformed", f"the remote server at {self.root} sent `choices` {data[:80]!r}")
        if choices:
            self._choice(choices[0])

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        content = delta.get("content") or ""
        entries = (choice.get("logprobs") or {}).get("content") or []
        now = time.monotonic()
        if entries:  # one token event per token the server reports; the chunk's text goes with the last
            for i, entry in enumerate(entries):
                self._token(content if i == len(entries) - 1 else "", entry, now)
        elif content:
            self._token(content, None, now)
        reason = choice.get("finish_reason")
        if reason:
            stop = choice.get("stop_reason")  # vLLM: the stop string that matched
            self.finish = "stop_string" if isinstance(stop, str) else STOP_REASONS.get(reason, reason)

    def _token(self, text: str, entry: dict | None, now: float) -> None:
        seq = self.seq
        index = len(seq.output_ids)
        step_ms = (now - seq.token_times[-1]) * 1000 if seq.token_times else 0.0
        seq.output_ids.append(-1)  # the server sends token text, not ids
        seq.token_times.append(now)
        buffered = seq.params.delivery == "buffered"
        if text and seq.first_text_at is None and not buffered:
            seq.first_text_at = now
        seq.released_text += text
        self.text += text
        # positions: prompt + tokens so far (computed), when the prompt was counted here
        cache = self.prompt_tokens + index if self.prompt_tokens is not None else None
        per_token = self.kv_bytes_per_token
        prob, candidates = probabilities(entry)
        event = ev.Token(
            request_id=seq.id,
            t_ms=seq.ms_since_submit(now),
            index=index,
            id=None,  # not sent by the server
            text="" if buffered else text,
            pending=False,
            step_ms=step_ms,
            cache_tokens=cache,
            cache_bytes_measured=None,  # not visible from outside the server
            cache_bytes_formula=cache * per_token if cache is not None and per_token else None,
            prob=prob,
            candidates=candidates,
            kv_blocks=None,
            kv_bytes_reserved=None,
            batch_size=None,
        )
        if not self.handle.push(event):  # the client fell behind: drop it as the engine does
            self.handle.cancel("slow_client")

    # ---- its one terminal event ----------------------------------------------------------------------

    def metrics(self, now: float) -> dict[str, Any]:
        """kvscope's clock figures; queue vs prefill is not visible from outside the server."""
        return {**request_metrics(self.seq, now), "queue_ms": None, "prefill_ms": None}

    def finished(self, reason: str) -> ev.Finished:
        seq, now = self.seq, time.monotonic()
        tokens = len(seq.output_ids)
        reported = self.usage.get("completion_tokens")
        if isinstance(reported, int) and reported > tokens:  # chunks without logprobs may hold several tokens
            tokens = reported
        return ev.Finished(
            request_id=seq.id,
            t_ms=seq.ms_since_submit(now),
            reason=reason,
            token_index=tokens - 1,
            tokens=tokens,
            text=self.text,
            metrics=self.metrics(now),
        )

    def cancelled(self) -> ev.Cancelled:
        seq, now = self.seq, time.monotonic()
        return ev.Cancelled(
            request_id=seq.id,
            t_ms=seq.ms_since_submit(now),
            reason="cancelled",
            cause=seq.cancel_cause,
            state="decode" if seq.output_ids else "waiting",  # queued or prefilling: not visible from outside
            tokens=len(seq.output_ids),
            text=self.text,
            metrics=self.metrics(now),
        )

    def failed(self, exc: RemoteFailure) -> ev.Error:
        return ev.Error(
            request_id=self.seq.id,
            t_ms=self.seq.ms_since_submit(),
            code=exc.code,
            message=exc.message,
            field=exc.field,
        )


def probabilities(entry: dict | None) -> tuple[float | None, list[ev.Candidate]]:
    """A token's probability and its candidates from the server's logprobs entry (None, [] without)."""
    if not isinstance(entry, dict):
        return None, []

    def prob(item) -> float | None:
        lp = item.get("logprob") if isinstance(item, dict) else None
        return math.exp(lp) if isinstance(lp, (int, float)) else None

    tops = entry.get("top_logprobs") or []
    candidates = [
        ev.Candidate(id=None, text=str(t.get("token", "")), prob=prob(t)) for t in tops if isinstance(t, dict)
    ]
    return prob(entry), candidates
