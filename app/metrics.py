"""`GET /metrics`: the engine in Prometheus text format, under vLLM's metric names where the meaning
is the same, so dashboards made for vLLM work (docs/protocol.md, "Prometheus metrics").

Each app has its own CollectorRegistry (tests create many apps; the global registry would refuse the
second). Gauges, and the preemption counter, read `engine.snapshot()` at scrape time; the token
counters, prefix-cache counters and latency histograms are fed from each request's end, through
`engine.add_end_listener`. Every series carries a `model_name` label."""

from __future__ import annotations

import weakref
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from model_runner.metrics import request_metrics

from .api import public_source
from .engine_ext import KEY as ENGINE_KEY

KEY = "kvscope_metrics"
LABELS = ["model_name"]

# vLLM's buckets (seconds), so histograms line up with its dashboards.
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip

bp = Blueprint("metrics", __name__)


def model_name(engine: Any) -> str:
    """The served model's id, as /v1/models and /api/model show it (never a filesystem path), so
    this label matches the OpenAI API's `model` as vLLM's does; "kvscope" until the model is loaded."""
    facts = getattr(engine, "facts", None)
    return (public_source(facts.source or facts.name) if facts is not None else None) or "kvscope"


class _SnapshotCollector:
    """Gauges (and the engine's own preemption counter) read from the engine at scrape time."""

    def __init__(self, metrics: "Metrics"):
        self._metrics = weakref.ref(metrics)

    def describe(self):  # no scrape at registration: the engine may still be loading
        return []

    def collect(self):
        metrics = self._metrics()
        if metrics is None:
            return
        engine, name = metrics.engine, metrics.name()
        try:
            snap = engine.snapshot()
        except Exception:  # a stand-in engine without a snapshot, or one that failed: no gauges
            return
        kv = snap.get("kv") or {}
        total = kv.get("total") or 0
        for metric, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", snap.get("running", 0)),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", snap.get("waiting", 0)),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage (blocks held by requests / pool blocks).",
                kv.get("used", 0) / total if total else 0.0,
            ),
        ):
            gauge = GaugeMetricFamily(metric, doc, labels=LABELS)
            gauge.add_metric([name], float(value))
            yield gauge
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions", "Cumulative number of preemptions from the engine.", labels=LABELS
        )
        preemptions.add_metric([name], float(snap.get("preemptions", 0)))
        yield preemptions


class Metrics:
    """One app's registry and the metrics fed from request ends."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS,
            registry=r,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", LABELS, registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(  # vLLM's older name for the same per-token gaps
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (deprecated name of inter_token_latency).",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.request_tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e, self.queue, self.prefill, self.decode = (
            Histogram(metric, doc, LABELS, buckets=REQUEST_BUCKETS, registry=r)
            for metric, doc in (
                ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
                ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
                ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
                ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
            )
        )
        self.labelled = [m for m in vars(self).values() if isinstance(m, (Counter, Histogram))]
        r.register(_SnapshotCollector(self))

    def name(self) -> str:
        return model_name(self.engine)

    def touch(self) -> None:
        """Every series at zero for the current model name before its first observation (as vLLM
        does), so dashboards and rate() see them from the first scrape."""
        if getattr(self.engine, "facts", None) is None:  # not loaded: no series under a placeholder name
            return
        name = self.name()
        for metric in self.labelled:
            metric.labels(name)

    def observe_end(self, seq: Any, event: dict[str, Any]) -> None:
        """One request's end (any outcome): its tokens and, for the phases it reached, its times."""
        m = event.get("metrics")
        if m is None:  # an `error` terminal carries no metrics: the same figures from the sequence
            m = request_metrics(seq, seq.submitted_at + event["t_ms"] / 1000)
        name = self.name()
        started = seq.prefill_start is not None
        self.generation_tokens.labels(name).inc(len(seq.output_ids))
        if started:
            self.prompt_tokens.labels(name).inc(len(seq.prompt_ids))
            if seq.uses_cache:  # every admitted request that uses the pool looks its prompt up
                self.prefix_queries.labels(name).inc(len(seq.prompt_ids))
                self.prefix_hits.labels(name).inc(seq.prefix_hit)
            self.queue.labels(name).observe(m["queue_ms"] / 1000)
        if m["e2e_ms"] is not None:
            self.e2e.labels(name).observe(m["e2e_ms"] / 1000)
        if m["ttft_ms"] is not None:
            self.ttft.labels(name).observe(m["ttft_ms"] / 1000)
            if m["prefill_ms"] is not None:  # a remote engine cannot see where queueing ends and prefill starts
                self.prefill.labels(name).observe(m["prefill_ms"] / 1000)
            times = seq.token_times
            if times:
                self.decode.labels(name).observe(times[-1] - times[0])
        if m["tpot_ms"] is not None:
            self.request_tpot.labels(name).observe(m["tpot_ms"] / 1000)
        itl, tpot = self.itl.labels(name), self.tpot.labels(name)
        for gap_ms in m["itl_ms"]:
            itl.observe(gap_ms / 1000)
            tpot.observe(gap_ms / 1000)


def _listener(ref: "weakref.ref[Metrics]"):
    """The engine holds only this: an app that is gone leaves a listener that does nothing."""

    def on_end(seq: Any, event: dict[str, Any]) -> None:
        metrics = ref()
        if metrics is not None:
            metrics.observe_end(seq, event)

    return on_end


def init_app(app: Flask) -> None:
    """Call after engine_ext.init_app: the registry, the end listener and the route."""
    engine = app.extensions[ENGINE_KEY]
    metrics = Metrics(engine)
    app.extensions[KEY] = metrics
    add = getattr(engine, "add_end_listener", None)
    if callable(add):  # stand-in engines in tests may have none: gauges only
        add(_listener(weakref.ref(metrics)))
    app.register_blueprint(bp)


@bp.get("/metrics")
def scrape() -> Response:
    """Prometheus text (0.0.4) unless the scraper asks for OpenMetrics, as prometheus_client's own server does."""
    metrics: Metrics = current_app.extensions[KEY]
    metrics.touch()
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = Response(encode(metrics.registry), content_type=content_type)
    response.headers["Cache-Control"] = "no-store"
    return response
