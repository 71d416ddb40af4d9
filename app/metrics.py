"""`GET /metrics`: the engine in Prometheus text format, under vLLM's metric names where the meaning
is the same, so dashboards made for vLLM work (docs/protocol.md, "Prometheus metrics").

The families are the ones `SERIES` lists, nothing else. Each app has its own CollectorRegistry (tests
create many apps; the global registry would refuse the second). Gauges, and the preemption counter,
read `engine.snapshot()` at scrape time; the token counters, request outcomes (`finished_reason`),
prefix-cache counters and latency histograms are fed from each request's end, through
`engine.add_end_listener`. Every series carries a `model_name` label: the first served name, else
the model's own id, as vLLM sets it."""

from __future__ import annotations

import weakref
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from app.engine_ext import KEY as ENGINE_KEY
from app.model_names import model_ids
from app.outcomes import FINISH_REASONS
from model_runner.interface import EngineInterface
from model_runner.protocol.metrics import request_metrics

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

# Every metric family /metrics exposes: (name, type, help, buckets for a histogram). The one list:
# the registry is built from it and tests/unit/test_prometheus.py checks the scrape against it.
# vLLM removed `vllm:time_per_output_token_seconds` in favour of `vllm:inter_token_latency_seconds`.
SERIES = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", None),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", None),
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage (blocks held by requests / pool blocks).",
        None,
    ),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemptions from the engine.", None),
    ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", None),
    ("vllm:generation_tokens", "counter", "Number of generation tokens processed.", None),
    ("vllm:request_success", "counter", "Count of successfully processed requests.", None),
    ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.", None),
    ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.", None),
    ("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    (
        "vllm:request_time_per_output_token_seconds",
        "histogram",
        "Histogram of time_per_output_token_seconds per request.",
        ITL_BUCKETS,
    ),
    ("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS),
    (
        "vllm:request_queue_time_seconds",
        "histogram",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_BUCKETS,
    ),
    (
        "vllm:request_prefill_time_seconds",
        "histogram",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_BUCKETS,
    ),
    (
        "vllm:request_decode_time_seconds",
        "histogram",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_BUCKETS,
    ),
    # kvscope's own (vLLM has no such series): the `--batch-invariant` mode, 1 when on.
    (
        "kvscope:batch_invariant",
        "gauge",
        "1 when batch-invariant decoding is on (a request's logits do not depend on its company), else 0.",
        None,
    ),
)
METRIC_NAMES = tuple(name for name, *_ in SERIES)
# Read from engine.snapshot() at scrape time; every other series is fed from request ends.
SNAPSHOT_READS = {
    "vllm:num_requests_running": lambda snap: snap.get("running", 0),
    "vllm:num_requests_waiting": lambda snap: snap.get("waiting", 0),
    "vllm:kv_cache_usage_perc": lambda snap: usage_share(snap.get("kv") or {}),
    "vllm:num_preemptions": lambda snap: snap.get("preemptions", 0),
    "kvscope:batch_invariant": lambda snap: 1 if (snap.get("batch_invariant") or {}).get("on") else 0,
}
# vLLM's finished_reason values (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS, less "repetition",
# which kvscope never detects), each series present from the first scrape as vLLM's are.
FINISHED_REASONS = ("stop", "length", "abort", "error")
SUCCESS_LABELS = ["model_name", "finished_reason"]

bp = Blueprint("metrics", __name__)


def usage_share(kv: dict) -> float:
    total = kv.get("total") or 0
    return kv.get("used", 0) / total if total else 0.0


def finished_reason(event: dict[str, Any]) -> str:
    """A terminal event's vLLM finished_reason: the OpenAI API's finish_reason for a finished request
    (timeout counts as `length`, as there), `abort` for a cancel, `error` for an error."""
    if event["type"] == "finished":
        return FINISH_REASONS.get(event.get("reason", ""), "length")
    return "abort" if event["type"] == "cancelled" else "error"


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
        try:
            snap = metrics.engine.snapshot()
        except Exception:  # a stand-in engine without a snapshot, or one that failed: no gauges
            return
        name = metrics.name()
        for metric, kind, doc, _ in SERIES:
            if metric in SNAPSHOT_READS:
                family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(metric, doc, labels=LABELS)
                family.add_metric([name], float(SNAPSHOT_READS[metric](snap)))
                yield family


class Metrics:
    """One app's registry and the metrics fed from request ends."""

    def __init__(self, engine: EngineInterface, served_names: str | list[str] | tuple[str, ...] = ()):
        self.engine = engine
        self.served_names = served_names
        self.registry = CollectorRegistry(auto_describe=True)
        self.fed: dict[str, Counter | Histogram] = {}
        for metric, kind, doc, buckets in SERIES:
            if metric in SNAPSHOT_READS:
                continue
            labels = SUCCESS_LABELS if metric == "vllm:request_success" else LABELS
            if kind == "counter":
                self.fed[metric] = Counter(metric, doc, labels, registry=self.registry)
            else:
                self.fed[metric] = Histogram(metric, doc, labels, buckets=buckets, registry=self.registry)
        self.registry.register(_SnapshotCollector(self))

    def name(self) -> str:
        """The `model_name` label as vLLM sets it: the first served name, else the model's own id."""
        return model_ids(self.engine.facts, self.served_names)[0]

    def series(self, metric: str, **labels: str):
        return self.fed[metric].labels(model_name=self.name(), **labels)

    def touch(self) -> None:
        """Every series at zero for the current model name before its first observation (as vLLM
        does), so dashboards and rate() see them from the first scrape."""
        if self.engine.facts is None:  # not loaded: no series under a placeholder name
            return
        for metric in self.fed:
            if metric == "vllm:request_success":
                for reason in FINISHED_REASONS:
                    self.series(metric, finished_reason=reason)
            else:
                self.series(metric)

    def observe_end(self, seq: Any, event: dict[str, Any]) -> None:
        """One request's end (any outcome): its tokens and, for the phases it reached, its times."""
        m = event.get("metrics")
        if m is None:  # an `error` terminal carries no metrics: the same figures from the sequence
            m = request_metrics(seq, seq.submitted_at + event["t_ms"] / 1000)
        self.series("vllm:request_success", finished_reason=finished_reason(event)).inc()
        self.series("vllm:generation_tokens").inc(len(seq.output_ids))
        if seq.prefill_start is not None:
            self.series("vllm:prompt_tokens").inc(len(seq.prompt_ids))
            if seq.uses_cache:  # every admitted request that uses the pool looks its prompt up
                self.series("vllm:prefix_cache_queries").inc(len(seq.prompt_ids))
                self.series("vllm:prefix_cache_hits").inc(seq.prefix_hit)
            self.series("vllm:request_queue_time_seconds").observe(m["queue_ms"] / 1000)
        self._observe_times(seq, m)

    def _observe_times(self, seq: Any, m: dict[str, Any]) -> None:
        if m["e2e_ms"] is not None:
            self.series("vllm:e2e_request_latency_seconds").observe(m["e2e_ms"] / 1000)
        if m["ttft_ms"] is not None:
            self.series("vllm:time_to_first_token_seconds").observe(m["ttft_ms"] / 1000)
            if m["prefill_ms"] is not None:  # a remote engine cannot see where queueing ends and prefill starts
                self.series("vllm:request_prefill_time_seconds").observe(m["prefill_ms"] / 1000)
            if seq.token_times:
                self.series("vllm:request_decode_time_seconds").observe(seq.token_times[-1] - seq.token_times[0])
        if m["tpot_ms"] is not None:
            self.series("vllm:request_time_per_output_token_seconds").observe(m["tpot_ms"] / 1000)
        itl = self.series("vllm:inter_token_latency_seconds")
        for gap_ms in m["itl_ms"]:
            itl.observe(gap_ms / 1000)


def _listener(ref: "weakref.ref[Metrics]"):
    """The engine holds only this: an app that is gone leaves a listener that does nothing."""

    def on_end(seq: Any, event: dict[str, Any]) -> None:
        metrics = ref()
        if metrics is not None:
            metrics.observe_end(seq, event)

    return on_end


def init_app(app: Flask) -> None:
    """Call after engine_ext.init_app: the registry, the end listener and the route."""
    disable_created_metrics()  # no `*_created` series beside each family, as vLLM turns them off (process-wide)
    engine = app.extensions[ENGINE_KEY]
    metrics = Metrics(engine, app.config.get("SERVED_MODEL_NAMES") or ())
    app.extensions[KEY] = metrics
    engine.add_end_listener(_listener(weakref.ref(metrics)))
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
