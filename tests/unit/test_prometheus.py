"""GET /metrics on the fake model: Prometheus text under vLLM's names, gauges that agree with
engine.snapshot(), and counters and histograms that count each finished request once."""

from __future__ import annotations

import pytest
from kvscope_testkit import ask as gen
from kvscope_testkit import blocks_mb, events_of, wait_until
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from app.metrics import FINISHED_REASONS, METRIC_NAMES, SERIES
from model_runner.loading.fake import ANSWER
from model_runner.shared.policy import Policy

ANSWER_TOKENS = len(ANSWER.encode()) + 1  # one token a byte, then the end-of-turn token
KINDS = {name: kind for name, kind, *_ in SERIES}
HISTOGRAMS = tuple(name for name, kind in KINDS.items() if kind == "histogram")
COUNTERS = tuple(name for name, kind in KINDS.items() if kind == "counter")
GAUGES = tuple(name for name, kind in KINDS.items() if kind == "gauge")
TTFT = "vllm:time_to_first_token_seconds"
# What dashboards made for vLLM read; the list in app/metrics.py must keep them.
DASHBOARD_NAMES = (
    "vllm:e2e_request_latency_seconds",
    "vllm:request_success",
    "vllm:inter_token_latency_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
)


def scrape(client) -> dict[str, dict]:
    """{family name: {"type": ..., "samples": {(sample name, frozenset(labels)): value}}}."""
    response = client.get("/metrics")
    assert response.status_code == 200
    families = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        samples = {(s.name, frozenset(s.labels.items())): s.value for s in family.samples}
        families[family.name] = {"type": family.type, "samples": samples}
    return families


def value(families, family: str, sample: str | None = None, **labels) -> float:
    """The one sample of `family` named `sample` (default: the family's own name) whose labels
    include `labels` (besides model_name)."""
    found = [
        v
        for (name, labs), v in families[family]["samples"].items()
        if name == (sample or family) and set(labels.items()) <= labs
    ]
    assert len(found) == 1, f"{sample or family} {labels}: {found}"
    return found[0]


@pytest.fixture
def app_for():
    def make(engine):
        return create_app({"TESTING": True, "ENGINE": engine})

    return make


def test_metrics_expose_exactly_the_families_of_the_one_list(engine_factory, app_for):
    families = scrape(app_for(engine_factory("fake")).test_client())
    assert sorted(families) == sorted(METRIC_NAMES)
    assert {name: family["type"] for name, family in families.items()} == KINDS
    assert set(DASHBOARD_NAMES) <= set(METRIC_NAMES)
    assert "vllm:time_per_output_token_seconds" not in METRIC_NAMES  # removed by vLLM


def test_metrics_parse_as_prometheus_text_with_vllm_names_and_a_model_label(engine_factory, app_for):
    engine = engine_factory("fake")
    response = app_for(engine).test_client().get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain" and "version=0.0.4" in response.content_type
    families = scrape(app_for(engine).test_client())
    for name in GAUGES:
        assert families[name]["type"] == "gauge"
    for name in COUNTERS:
        assert families[name]["type"] == "counter"
        if name == "vllm:request_success":  # one series per finished_reason, as vLLM's
            for reason in FINISHED_REASONS:
                assert value(families, name, name + "_total", finished_reason=reason) == 0
        else:
            assert value(families, name, name + "_total") == 0
    for name in HISTOGRAMS:
        assert families[name]["type"] == "histogram"
        assert value(families, name, name + "_count") == 0
    for family in families.values():  # the served model's id, as the OpenAI API names it
        assert all(dict(labels)["model_name"] == "fake" for _, labels in family["samples"])


def test_openmetrics_when_the_scraper_asks_for_it(engine_factory, app_for):
    client = app_for(engine_factory("fake")).test_client()
    response = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.status_code == 200 and response.mimetype == "application/openmetrics-text"
    assert response.get_data(as_text=True).rstrip().endswith("# EOF")


def test_finished_requests_fill_the_histograms_and_token_counters(engine_factory, app_for):
    engine = engine_factory("fake")
    client = app_for(engine).test_client()
    n = 3
    runs = [events_of(engine.submit(gen(max_new_tokens=8 + i), f"r{i}")) for i in range(n)]
    ends = [run[-1] for run in runs]
    assert all(end["type"] == "finished" for end in ends)
    families = scrape(client)
    for name in set(HISTOGRAMS) - {"vllm:inter_token_latency_seconds"}:  # one observation per request
        assert value(families, name, name + "_count") == n, name
    tokens = sum(end["tokens"] for end in ends)
    assert tokens == sum(8 + i for i in range(n))
    assert value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == tokens
    prompt = sum(run[0]["prompt_tokens"] for run in runs)
    assert value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt
    gaps = sum(len(end["metrics"]["itl_ms"]) for end in ends)
    assert gaps == tokens - n
    name = "vllm:inter_token_latency_seconds"
    assert value(families, name, name + "_count") == gaps
    ttft_s = sum(end["metrics"]["ttft_ms"] for end in ends) / 1000
    assert value(families, TTFT, TTFT + "_sum") == pytest.approx(ttft_s, abs=1e-6)
    assert value(families, TTFT, TTFT + "_bucket", le="+Inf") == n
    e2e_s = sum(end["metrics"]["e2e_ms"] for end in ends) / 1000
    e2e = "vllm:e2e_request_latency_seconds"
    assert value(families, e2e, e2e + "_sum") == pytest.approx(e2e_s, abs=1e-6)
    success = "vllm:request_success"
    assert value(families, success, success + "_total", finished_reason="length") == n  # all hit max_new_tokens
    assert value(families, success, success + "_total", finished_reason="stop") == 0
    assert value(families, "vllm:num_requests_running") == value(families, "vllm:num_requests_waiting") == 0
    assert value(families, "vllm:kv_cache_usage_perc") == 0


def test_a_request_cancelled_while_waiting_counts_no_prompt_and_no_first_token(engine_factory, app_for):
    engine = engine_factory("fake:delay=20", policy=Policy(max_num_seqs=1))
    client = app_for(engine).test_client()
    first = engine.submit(gen(max_new_tokens=200), "long")
    waiting = engine.submit(gen(max_new_tokens=8), "waits")
    wait_until(lambda: engine.snapshot()["running"] == 1, "the first request to run")
    waiting.cancel()
    end = events_of(waiting)[-1]
    assert (end["type"], end["state"]) == ("cancelled", "queued")
    first.cancel()
    events_of(first)
    families = scrape(client)
    assert value(families, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == 2
    assert value(families, TTFT, TTFT + "_count") == 1  # only the one that got a token
    prompt = len(first.sequence.prompt_ids)
    assert value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt
    success = "vllm:request_success"
    assert value(families, success, success + "_total", finished_reason="abort") == 2


def test_an_answer_that_ends_itself_counts_as_stop(engine_factory, app_for):
    engine = engine_factory("fake")
    client = app_for(engine).test_client()
    end = events_of(engine.submit(gen(max_new_tokens=200), "whole"))[-1]
    assert (end["type"], end["reason"]) == ("finished", "eos")
    success = "vllm:request_success"
    families = scrape(client)
    assert value(families, success, success + "_total", finished_reason="stop") == 1
    assert value(families, success, success + "_total", finished_reason="length") == 0


def test_the_model_name_label_is_the_first_served_name(engine_factory):
    engine = engine_factory("fake")
    app = create_app({"TESTING": True, "ENGINE": engine, "SERVED_MODEL_NAMES": ["tiny-chat", "other"]})
    events_of(engine.submit(gen(max_new_tokens=3), "named"))
    families = scrape(app.test_client())
    names = {dict(labels)["model_name"] for family in families.values() for _, labels in family["samples"]}
    assert names == {"tiny-chat"}
    assert value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == 3


def test_running_and_waiting_gauges_agree_with_the_engine_while_a_slow_request_runs(engine_factory, app_for):
    engine = engine_factory("fake:delay=20", policy=Policy(max_num_seqs=1))
    client = app_for(engine).test_client()
    handles = [engine.submit(gen(max_new_tokens=200), f"s{i}") for i in range(3)]
    wait_until(lambda: engine.snapshot()["running"] == 1 and engine.snapshot()["kv"]["used"] > 0, "one to run")

    def steady():  # the snapshot did not change around the scrape (the engine keeps stepping)
        before = engine.snapshot()
        families = scrape(client)
        after = engine.snapshot()
        same = {k: before[k] for k in ("running", "waiting", "kv")} == {
            k: after[k] for k in ("running", "waiting", "kv")
        }
        return (families, after) if same else None

    families, snap = wait_until(steady, "a scrape between two equal snapshots")
    assert value(families, "vllm:num_requests_running") == snap["running"] == 1
    assert value(families, "vllm:num_requests_waiting") == snap["waiting"] == 2
    usage = value(families, "vllm:kv_cache_usage_perc")
    assert usage == pytest.approx(snap["kv"]["used"] / snap["kv"]["total"]) and 0 < usage <= 1
    for h in handles:
        h.cancel()
    for h in handles:
        events_of(h)
    families = scrape(client)
    assert value(families, "vllm:num_requests_running") == value(families, "vllm:num_requests_waiting") == 0


def test_preemptions_counter_equals_the_engines_on_a_tiny_pool(engine_factory, app_for):
    engine = engine_factory("fake", kv_cache_mb=blocks_mb(20))
    client = app_for(engine).test_client()
    # 31-token prompts: 2 blocks each to start, 8 by the end of the answer; three cannot all finish together.
    handles = [engine.submit(gen("q", system="s", max_new_tokens=100), f"p{i}") for i in range(3)]
    ends = [events_of(h)[-1] for h in handles]
    assert all(end["type"] == "finished" for end in ends)
    families = scrape(client)
    assert engine.preemptions > 0
    assert value(families, "vllm:num_preemptions", "vllm:num_preemptions_total") == engine.preemptions
    assert value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == 3 * ANSWER_TOKENS
    assert value(families, TTFT, TTFT + "_count") == 3


def test_prefix_cache_counters_count_queried_and_found_prompt_tokens(engine_factory, app_for):
    engine = engine_factory("fake", policy=Policy(prefix_caching=True))
    client = app_for(engine).test_client()
    runs = [events_of(engine.submit(gen(max_new_tokens=4), f"x{i}")) for i in range(2)]  # the same prompt twice
    families = scrape(client)
    hits = value(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    assert hits > 0 and hits == engine.snapshot()["prefix_hit_tokens"]
    queries = value(families, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    assert queries == sum(run[0]["prompt_tokens"] for run in runs) > hits


def test_each_app_has_its_own_registry(engine_factory, app_for):
    engine = engine_factory("fake")
    first, second = app_for(engine).test_client(), app_for(engine).test_client()  # no duplicate-name error
    events_of(engine.submit(gen(max_new_tokens=4), "one"))
    for client in (first, second):
        families = scrape(client)
        assert value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == 4


def test_a_stand_in_engine_without_snapshot_or_listeners_still_answers(app_for):
    class Bare:  # no model loaded, no snapshot(); a listener is taken but never called
        facts = None

        def add_end_listener(self, fn):  # every engine has one (model_runner/interface.py)
            pass

    families = scrape(app_for(Bare()).test_client())
    assert "vllm:num_requests_running" not in families
    assert families["vllm:generation_tokens"]["samples"] == {}  # no series under a placeholder model name
