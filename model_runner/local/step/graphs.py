"""CUDA graphs of the static decode step (step/static_step.py): each bucket's step is captured on first
use — one warm-up run on a side stream, the capture into a memory pool all buckets share, one replay —
and replayed from then on, so a decode step costs one launch instead of hundreds of small kernels launched
from Python. A bucket whose capture fails runs the static step eagerly from then on (logged, counted):
a request never breaks for a graph. The graphs read the pool's one cache tensor; a new pool means a new
StaticDecodeStep and new graphs."""

from __future__ import annotations

import logging
import time
from typing import Any, Hashable, Protocol

import torch

from model_runner.local.kv_cache import PagedKVPool

log = logging.getLogger("kvscope.engine")

CUDA_GRAPH_MODES = ("auto", "off", "padded")  # padded: the static step without graphs (the CPU's test path)


class Capturable(Protocol):
    """What the graphs capture (step/static_step.py's StaticDecodeStep): `run(bucket)` is device work only, at
    the bucket's shapes (a hashable with `rows` and `keys`), over the pool's one cache tensor."""

    pool: PagedKVPool

    def run(self, bucket: Hashable) -> torch.Tensor: ...


def graphs_wanted(mode: str, device: torch.device) -> bool:
    """auto: on for CUDA, off elsewhere; off and padded: never."""
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, got {mode!r}")
    return mode == "auto" and device.type == "cuda" and torch.cuda.is_available()


class DecodeGraphs:
    """One captured graph per bucket over a static step; `run(bucket)` after `step.fill(...)`."""

    def __init__(self, step: Capturable):
        self.step = step
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._failed: set[Hashable] = set()
        self._memory = torch.cuda.graph_pool_handle()  # shared by every bucket's graph
        self._cache_ptr = step.pool.cache.cache_tensor.data_ptr()
        self.capture_ms: dict[Hashable, float] = {}
        self.replays = 0
        self.last_failure: str | None = None

    def run(self, bucket: Hashable) -> torch.Tensor:
        """The bucket's logits [rows, vocab], by replay (captured now if it is new); the static step
        run eagerly when the bucket cannot be captured."""
        self._drop_if_pool_moved()
        if bucket in self._failed:
            return self.step.run(bucket)
        if bucket not in self._graphs:
            try:
                self._capture(bucket)
            except Exception as exc:  # a graph is an optimisation: the step runs without one
                self._failed.add(bucket)
                self.last_failure = f"{type(exc).__name__}: {exc}"
                log.warning("CUDA graph capture of %s failed, running it without a graph: %s", bucket, exc)
                torch.cuda.synchronize()
                return self.step.run(bucket)
        graph, logits = self._graphs[bucket]
        graph.replay()
        self.replays += 1
        return logits

    def _capture(self, bucket: Hashable) -> None:
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up: lazy initialisation outside the capture
            self.step.run(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA call during the capture does not invalidate it
        with torch.cuda.graph(graph, pool=self._memory, capture_error_mode="thread_local"):
            logits = self.step.run(bucket)
        # The warm-up already wrote this step's keys and values; the replay writes the same ones again.
        graph.replay()
        torch.cuda.synchronize()
        self._graphs[bucket] = (graph, logits)
        self.capture_ms[bucket] = (time.perf_counter() - t0) * 1000
        log.info(
            "captured the decode step for %d rows and %d keys in %.0f ms",
            bucket.rows,
            bucket.keys,
            self.capture_ms[bucket],
        )

    def _drop_if_pool_moved(self) -> None:
        """Graphs point at the cache tensor they were captured with; if it is another now, capture anew."""
        ptr = self.step.pool.cache.cache_tensor.data_ptr()
        if ptr != self._cache_ptr:
            log.info("the KV pool moved: dropping %d captured decode graphs", len(self._graphs))
            self._graphs.clear()
            self._failed.clear()
            self._cache_ptr = ptr

    def report(self) -> dict[str, Any]:
        """For the engine's snapshot: graphs captured, their capture time, replays, failures. Read from any
        thread: it copies what the worker writes before reading it."""
        captured = sorted(dict(self.capture_ms).items(), key=lambda item: (item[0].rows, item[0].keys))
        return {
            "captured": len(captured),
            "capture_ms_total": round(sum(ms for _, ms in captured), 1),
            "buckets": [{"rows": b.rows, "keys": b.keys, "capture_ms": round(ms, 1)} for b, ms in captured],
            "replays": self.replays,
            "failed": len(self._failed),
            "last_failure": self.last_failure,
        }
