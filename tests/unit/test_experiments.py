"""The experiments API on the fake model: each experiment's answer fits the contract and its numbers
come from the engine's own events; one job at a time (409), policy experiments refused where policy
changes are (403) and the policy restored after; bad params named. Also the speculative-decoding
algorithm: its output is plain greedy's whatever the proposer guesses, and its counts add up."""

from __future__ import annotations

import threading

import pytest
from kvscope_testkit import blocks_mb, wait_until

from app import create_app
from app.experiments import LOCK_KEY
from formulas import cost
from model_runner.loading.model_shape import shape_of
from model_runner.protocol.metrics import percentile
from serving_experiments.contract import DECODER_WORDS, check_response
from serving_experiments.evidence import FLOORS, LOADED, loaded, point_evidence
from serving_experiments.experiments.attention_cost import line_fit
from serving_experiments.experiments.why_batch import BATCHES, PREFILL_RUNS
from serving_experiments.harness import Job
from serving_experiments.registry import EXPERIMENTS
from serving_experiments.speculative import DraftModel, PromptLookup, plain_greedy, speculative_greedy

SMALL = {
    "why_batch": {"new_tokens": 3},
    "batching": {"requests": 4, "batch_size": 2, "new_tokens": 6},
    "paged_blocks": {"requests": 2, "new_tokens": 4},
    "chunked_prefill": {"chunk_size": 16, "long_prompt_tokens": 96, "new_tokens": 8},
    "prefix_caching": {"requests": 2, "new_tokens": 1},
    "attention_cost": {"max_positions": 256, "new_tokens": 4},
    "speculative": {"new_tokens": 12},
    "pricing": {"prompt_tokens": 64, "new_tokens": 4},
    "batch_invariance": {"requests": 2, "new_tokens": 4},
}


@pytest.fixture
def fake_app(engine_factory):
    engine = engine_factory("fake")
    app = create_app({"ENGINE": engine})
    return app, engine


@pytest.fixture
def feed_log(fake_app):
    """Every engine_step the feed publishes while the test runs (a second observer, not the job's)."""
    _, engine = fake_app
    sub = engine.feed.subscribe(capacity=8192)
    log: list[dict] = []

    def drain():
        while (event := sub.next_event(timeout=0)) is not None:
            log.append(event)
        return log

    yield drain
    sub.close()


def post(app, name, params=None):
    return app.test_client().post(f"/api/experiments/{name}", json=params if params is not None else {})


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_each_experiment_answers_the_contract_shape(fake_app, name, monkeypatch):
    app, engine = fake_app
    monkeypatch.setattr(
        "serving_experiments.roofline.ceilings", lambda device, dtype: (1e11, 1e10)
    )  # no 256 MiB copy here
    before = engine.policy
    response = post(app, name, SMALL[name])
    assert response.status_code == 200, response.json
    assert check_response(name, response.json) == []
    assert response.json["machine"]["route"] == engine.facts.dtype_route  # the route every time in it ran on
    # whether prompts ran on float32 copies: the page names the prefill's kernel from it (shared/route.js kernelsOf)
    assert response.json["machine"]["float_prefill"] is bool((engine.facts.cost_shape or {}).get("float_prefill"))
    # the decoder that ran the steps, named as a recording's source line names it
    assert response.json["machine"]["decoder"] == DECODER_WORDS[engine.decoder()["name"]]
    assert response.json["params"] == {**{k: p.default for k, p in EXPERIMENTS[name].params.items()}, **SMALL[name]}
    assert engine.policy == before  # whatever it set for its run is undone
    assert engine.active == 0


def test_batching_cells_are_the_feeds_batch_membership(fake_app, feed_log):
    app, _ = fake_app
    result = post(app, "batching", SMALL["batching"]).json["result"]
    steps = [
        e for e in feed_log() if e["type"] == "engine_step" and all(r["label"] == "experiment" for r in e["batch"])
    ]
    ours = result["runs"]["static"]["steps"] + result["runs"]["continuous"]["steps"]
    assert len(ours) == len(steps)
    for cells, event in zip(ours, steps):
        ran = sorted(c for c in cells["cells"].values() if c in ("prefill", "decode"))
        assert ran == sorted(r["kind"] for r in event["batch"])
        assert cells["ms"] == event["ms"]


def test_static_batching_admits_only_into_an_empty_batch(fake_app):
    app, _ = fake_app
    runs = post(app, "batching", SMALL["batching"]).json["result"]["runs"]
    static, continuous = runs["static"]["steps"], runs["continuous"]["steps"]
    for prev, step in zip(static, static[1:]):
        starting = [r for r, c in step["cells"].items() if c == "prefill" and prev["cells"][r] == "waiting"]
        running = [
            r for r, c in prev["cells"].items() if c in ("prefill", "decode", "idle") and step["cells"][r] != "done"
        ]
        assert not (starting and running), f"step {step['step']}: {starting} admitted while {running} still run"
    # the same tokens in fewer steps when a finished request's place is refilled at once
    assert len(continuous) < len(static)
    assert runs["continuous"]["idle_slot_share"] < runs["static"]["idle_slot_share"]
    assert runs["static"]["tokens"] == runs["continuous"]["tokens"]


def test_prefix_caching_reuses_the_system_prompts_blocks_only_when_on(fake_app):
    app, _ = fake_app
    result = post(app, "prefix_caching", {"requests": 3, "new_tokens": 1}).json["result"]
    off, on = result["runs"]["off"]["requests"], result["runs"]["on"]["requests"]
    assert all(r["cached_tokens"] == 0 for r in off)
    assert on[0]["cached_tokens"] == 0  # the first one finds a cold cache: "off" dropped what was kept
    for r in on[1:]:
        assert r["cached_tokens"] >= result["system_prompt_tokens"] - result["block_size"]
        assert r["cached_tokens"] % result["block_size"] == 0
        assert r["prefill_tokens"] + r["cached_tokens"] == r["prompt_tokens"]


def test_chunked_prefill_splits_the_long_prompt_only_when_on(fake_app):
    app, _ = fake_app
    result = post(app, "chunked_prefill", SMALL["chunked_prefill"]).json["result"]
    assert result["runs"]["off"]["long_prefill_steps"] == 1
    expected = -(-result["long_prompt_tokens"] // result["chunk_size"])
    assert result["runs"]["on"]["long_prefill_steps"] == expected
    assert all(len(g) == SMALL["chunked_prefill"]["new_tokens"] - 2 for g in result["runs"]["on"]["gaps_ms"])


def test_paged_blocks_frames_match_the_pool(fake_app):
    app, engine = fake_app
    result = post(app, "paged_blocks", SMALL["paged_blocks"]).json["result"]
    assert result["pool_blocks"] == engine.pool.total_blocks
    assert result["bytes_per_block"] == engine.pool.bytes_per_block
    owners = {o for f in result["frames"] for o in f["owners"] if o}
    assert owners == {"A", "B"}
    assert result["used_bytes"] <= result["reserved_bytes"]
    # a contiguous cache reserves each request's prompt + its maximum answer; the whole window is far more
    assert result["used_bytes"] <= result["contiguous_bytes"] < result["window_bytes"]
    assert result["contiguous_bytes"] % result["kv_bytes_per_token"] == 0
    assert result["frames"][-1]["owners"] == [None] * len(result["block_ids"])  # all given back at the end


def test_policy_is_restored_when_an_experiment_fails(fake_app, monkeypatch):
    app, engine = fake_app
    engine.set_policy(max_num_seqs=7, chunk_size=48)
    before = engine.policy

    def broken(self):
        raise RuntimeError("injected")

    monkeypatch.setattr(Job, "wait", broken)
    response = post(app, "batching", SMALL["batching"])
    assert response.status_code == 500 and "injected" in response.json["error"]["message"]
    assert engine.policy == before
    assert not app.extensions[LOCK_KEY].locked()
    wait_until(lambda: engine.active == 0, "the experiment's requests cancelled")


def test_policy_experiments_are_refused_where_policy_changes_are(engine_factory):
    engine = engine_factory("fake")
    app = create_app({"ENGINE": engine, "ALLOW_POLICY_CHANGES": False})
    listed = {e["name"]: e for e in app.test_client().get("/api/experiments").json["experiments"]}
    assert not listed["batching"]["available"] and "loopback" in listed["batching"]["why_unavailable"]
    assert listed["pricing"]["available"]
    response = post(app, "batching")
    assert response.status_code == 403
    assert response.json["error"]["code"] == "not_allowed"
    assert engine.steps == 0  # refused before any request ran
    assert post(app, "pricing", SMALL["pricing"]).status_code == 200


def test_a_second_experiment_is_busy_while_one_runs(engine_factory):
    engine = engine_factory("fake:delay=20")
    app = create_app({"ENGINE": engine})
    first: dict = {}
    thread = threading.Thread(target=lambda: first.update(r=post(app, "pricing", {"new_tokens": 24})))
    thread.start()
    wait_until(lambda: app.test_client().get("/api/experiments").json["busy"], "the first experiment to start")
    second = post(app, "paged_blocks")
    thread.join(60)
    assert second.status_code == 409 and second.json["error"]["code"] == "busy"
    assert first["r"].status_code == 200
    assert not app.test_client().get("/api/experiments").json["busy"]


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("batching", {"requests": 99}, "requests"),
        ("batching", {"batch_size": "2"}, "batch_size"),
        ("pricing", {"prompt_tokens": 5}, "prompt_tokens"),
        ("speculative", {"k": True}, "k"),
        ("why_batch", {"tokens": 4}, "tokens"),
        ("attention_cost", {"max_positions": 8193}, "max_positions"),
        ("attention_cost", {"new_tokens": 3}, "new_tokens"),
    ],
)
def test_bad_params_name_the_field_and_limit(fake_app, name, params, field):
    app, engine = fake_app
    response = post(app, name, params)
    assert response.status_code == 400
    error = response.json["error"]
    assert error["field"] == field and f"`{field}`" in error["message"]
    assert engine.steps == 0


def test_unknown_experiment_and_model_loading(fake_app):
    from model_runner.local.engine import Engine, EngineConfig

    app, _ = fake_app
    response = post(app, "nope")
    assert response.status_code == 404 and response.json["error"]["field"] == "name"
    loading = create_app({"ENGINE": Engine(EngineConfig(model="fake"))})  # never started: still loading
    assert post(loading, "pricing").status_code == 503
    listed = loading.test_client().get("/api/experiments").json["experiments"]
    assert all(not e["available"] and "loading" in e["why_unavailable"] for e in listed)


# ---- the speculative algorithm on the scripted model ------------------------------------------------------


@pytest.fixture(scope="module")
def scripted():
    from model_runner.loading.fake import build_fake

    model, tok = build_fake()
    prompt = [tok.IM_START, *b"user\nRepeat: the cache grows", tok.IM_END, tok.IM_START, *b"assistant\n"]
    return model, tok, prompt


class Oracle:
    """Proposes the true continuation but spoils it after `good` tokens: partial acceptance every step."""

    name = "oracle"

    def __init__(self, truth: list[int], good: int):
        self.truth, self.good = truth, good

    def propose(self, tokens, k):
        at = len(tokens)
        guess = self.truth[at : at + k]
        return [t if i < self.good else (t + 1) % 256 for i, t in enumerate(guess)]


def counts_add_up(run) -> bool:
    return sum(s.accepted + (s.bonus is not None) for s in run.steps) == len(run.token_ids)


@pytest.mark.parametrize("good", [0, 1, 2, 4])
def test_speculation_gives_plain_greedy_output_whatever_is_accepted(scripted, good):
    model, tok, prompt = scripted
    plain = plain_greedy(model, prompt, 40, tok.eos_ids)
    spec = speculative_greedy(model, prompt, 40, tok.eos_ids, Oracle(prompt + plain.token_ids, good), k=4)
    assert spec.token_ids == plain.token_ids
    assert counts_add_up(spec)
    decoding = spec.steps[1:]  # the first step is the prefill: nothing proposed
    assert all(s.accepted == min(good, len(s.proposed)) for s in decoding)
    assert all(s.rejected == len(s.proposed) - s.accepted for s in decoding)
    assert len(spec.steps) < len(plain.steps) if good else len(spec.steps) == len(plain.steps)


def test_speculation_stops_at_the_end_token_and_the_limit(scripted):
    model, tok, prompt = scripted
    plain = plain_greedy(model, prompt, 400, tok.eos_ids)
    assert plain.token_ids[-1] in tok.eos_ids  # the script ends with <|im_end|>
    spec = speculative_greedy(model, prompt, 400, tok.eos_ids, Oracle(prompt + plain.token_ids, 4), k=4)
    assert spec.token_ids == plain.token_ids and counts_add_up(spec)
    for limit in (1, 5, 7):
        short = speculative_greedy(model, prompt, limit, tok.eos_ids, Oracle(prompt + plain.token_ids, 4), k=4)
        assert short.token_ids == plain.token_ids[:limit] and counts_add_up(short)


def test_a_draft_model_that_is_the_target_has_every_proposal_accepted(scripted):
    model, tok, prompt = scripted
    plain = plain_greedy(model, prompt, 21, tok.eos_ids)
    spec = speculative_greedy(model, prompt, 21, tok.eos_ids, DraftModel(model, "fake"), k=4)
    assert spec.token_ids == plain.token_ids and counts_add_up(spec)
    assert spec.accepted == spec.proposed == 16  # the prefill's token, then 4 steps of 4 accepted + 1 bonus: 21


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup(max_ngram=3)
    assert lookup.propose([5, 1, 2, 3, 9, 1, 2, 3, 4, 7, 1, 2, 3], 3) == [4, 7, 1]  # latest match of [1, 2, 3]
    assert lookup.propose([1, 2, 8, 9, 2], 2) == [8, 9]  # falls back to a 1-gram
    assert lookup.propose([1, 2, 3], 4) == []


def test_a_draft_model_from_the_server_config_proposes(engine_factory):
    engine = engine_factory("fake")
    app = create_app({"ENGINE": engine, "DRAFT_MODEL": "fake"})  # the same scripted model: it always agrees
    result = post(app, "speculative", {"new_tokens": 11}).json["result"]
    assert result["method"] == "draft model fake"
    for case in result["cases"]:
        assert case["identical"] and case["acceptance_rate"] == 1.0
        assert case["forwards"] < case["plain_forwards"]


def test_why_batch_measures_steps_where_the_whole_batch_decodes(fake_app, feed_log, monkeypatch):
    app, _ = fake_app
    monkeypatch.setattr("serving_experiments.roofline.ceilings", lambda device, dtype: (1e11, 1e10))
    result = post(app, "why_batch", {"new_tokens": 4}).json["result"]
    steps = [e for e in feed_log() if e["type"] == "engine_step"]
    for point in result["points"]:
        full = [
            e["ms"]
            for e in steps
            if len(e["batch"]) == point["batch"] and {r["kind"] for r in e["batch"]} == {"decode"}
        ]
        # every request prefills in one step, then decodes with all; batch 1 is run PREFILL_RUNS times
        runs = PREFILL_RUNS if point["batch"] == 1 else 1
        assert point["steps_measured"] == len(full) == 3 * runs
        assert point["step_ms"] == pytest.approx(min(full), abs=1e-3)  # best of the steps, median beside it
        assert point["step_ms_median"] == pytest.approx(percentile(full, 50), abs=1e-3)
    roof = result["roofline"]
    assert [p["phase"] for p in roof["points"]] == ["prefill"] + ["decode"] * len(BATCHES)
    # the floors are checked as the step runs: each point says whether its verdict is carried, and why not
    assert roof["floors_consistent"] == (roof["floor_problems"] == [])
    prefill = roof["points"][0]
    assert prefill["steps_measured"] == PREFILL_RUNS and "held_by_median" in prefill
    busy = loaded(roof["load_1m"], roof["threads"])  # the load as the roofline was measured
    for p in roof["points"]:
        assert p["evidence"] == point_evidence(p, roof["floors_consistent"], busy)
        assert p["step_ms_median"] >= p["step_ms"]


def test_why_batch_marks_its_verdicts_not_carried_when_a_floor_is_above_its_step(fake_app, monkeypatch):
    app, _ = fake_app
    monkeypatch.setattr("serving_experiments.roofline.ceilings", lambda device, dtype: (1e11, 1e10))
    # every kernel call "takes" a second: each floor is far above the fake model's steps
    monkeypatch.setattr("serving_experiments.kernels.Kernels.measure", lambda self, calls: dict.fromkeys(calls, 1.0))
    roof = post(app, "why_batch", {"new_tokens": 3}).json["result"]["roofline"]
    assert not roof["floors_consistent"]
    assert len(roof["floor_problems"]) == len(roof["points"])
    assert all("is not below its step" in q for q in roof["floor_problems"])
    assert {p["evidence"] for p in roof["points"]} == {FLOORS}


def test_no_experiment_runs_while_admissions_are_paused(fake_app):
    app, engine = fake_app
    engine.set_paused(True)
    try:
        response = post(app, "pricing")
        assert response.status_code == 409 and "paused" in response.json["error"]["message"]
        listed = app.test_client().get("/api/experiments").json["experiments"]
        assert all(not e["available"] for e in listed)
    finally:
        engine.set_paused(False)
    assert engine.steps == 0


def test_a_remote_engine_is_refused_by_its_missing_local_controls():
    from model_runner.remote.engine import RemoteConfig, RemoteEngine

    remote = RemoteEngine(RemoteConfig(url="openai:http://127.0.0.1:9"))  # never started: nothing connects
    app = create_app({"ENGINE": remote})
    listed = app.test_client().get("/api/experiments").json["experiments"]
    assert all(not e["available"] and "built-in engine" in e["why_unavailable"] for e in listed)
    response = post(app, "pricing")
    assert response.status_code == 403 and response.json["error"]["code"] == "not_allowed"


# ---- attention is not free ---------------------------------------------------------------------------------


@pytest.fixture
def fixed_ceilings(monkeypatch):
    """The roofline's measured ceilings, fixed (no 256 MiB copy in a unit test): 1e10 B/s of bandwidth."""
    monkeypatch.setattr("serving_experiments.roofline.ceilings", lambda device, dtype: (1e11, 1e10))
    return 1e10


def test_attention_cost_times_lone_decode_steps_at_each_length(fake_app, feed_log, fixed_ceilings):
    app, engine = fake_app
    result = post(app, "attention_cost", {"max_positions": 512, "new_tokens": 5}).json["result"]
    points = result["points"]
    window = engine.facts.context_window  # 512 on the fake, its pool holds 4,096: the window stops it
    assert [p["target"] for p in points] == [64, 256, 512]
    assert [p["at_limit"] for p in points] == [False, False, True]
    assert result["limit"]["held_by"] == "the model's context window" and result["not_reached"] == [512]
    assert points[-1]["prompt_tokens"] + 5 <= window and "512 positions not reached" in result["stopped"]
    steps = [e for e in feed_log() if e["type"] == "engine_step"]
    for p in points:
        if p["target"] > 64:  # the fake's template and question alone are 80 byte tokens: 64 cannot be met
            assert p["target"] - 8 < p["prompt_tokens"] <= min(p["target"], window - 5)
        ours = {s["step"] for s in p["steps"]}
        decodes = [e["ms"] for e in steps if e["step"] in ours and [r["kind"] for r in e["batch"]] == ["decode"]]
        assert p["steps_measured"] == len(decodes) == 4  # the first token comes from the prefill
        assert [s["cached_positions"] for s in p["steps"]] == [p["prompt_tokens"] + k + 1 for k in range(4)]
        assert p["step_ms"] == pytest.approx(min(decodes), abs=1e-3)
        assert p["step_ms_median"] == pytest.approx(percentile(decodes, 50), abs=1e-3)
        # its k-th decode step reads the prompt and the k tokens before it: 0, 1, 2, 3 more
        assert p["cached_positions"] == p["prompt_tokens"] + 2.5
        assert p["kv_bytes_read"] == engine.facts.kv_bytes_per_token * p["cached_positions"]
    block = engine.snapshot()["kv"]["block_size"]
    for shorter, longer in zip(points, points[1:]):  # each prompt's text a prefix of the next: its blocks reused
        # all but the question and the template's tail after the text (about 40 byte tokens), and the block they end in
        assert longer["cached_tokens"] >= shorter["prompt_tokens"] - 40 - block
        assert longer["cached_tokens"] % block == 0
        assert longer["prefill_tokens"] + longer["cached_tokens"] == longer["prompt_tokens"]


def test_attention_cost_stops_where_the_pool_cannot_hold_the_next_length(engine_factory, fixed_ceilings):
    engine = engine_factory("fake", kv_cache_mb=blocks_mb(20))  # 320 positions, under the fake's 512 window
    app = create_app({"ENGINE": engine})
    result = post(app, "attention_cost", {"max_positions": 2048, "new_tokens": 4}).json["result"]
    assert result["limit"] == {
        "prompt_tokens": 316,
        "pool_positions": 320,
        "context_window": 512,
        "held_by": "the KV pool",
    }
    assert [p["target"] for p in result["points"]] == [64, 256, 512]  # 512 ran at the pool's limit, then it stopped
    assert result["points"][-1]["prompt_tokens"] <= 316 and result["points"][-1]["at_limit"]
    assert result["not_reached"] == [512, 1024, 2048]
    assert result["stopped"].startswith("512, 1,024, 2,048 positions not reached: the KV pool holds 320")
    assert engine.active == 0 and engine.snapshot()["kv"]["used"] == 0


def test_attention_cost_fit_and_floor_come_from_the_points_and_cost_model(fake_app, fixed_ceilings):
    app, engine = fake_app
    result = post(app, "attention_cost", SMALL["attention_cost"]).json["result"]
    points = result["points"]
    intercept, slope = line_fit([p["cached_positions"] for p in points], [p["step_ms"] for p in points])
    assert result["fit"]["intercept_ms"] == pytest.approx(intercept, abs=1e-3)
    assert result["fit"]["slope_us_per_1k_positions"] == pytest.approx(slope * 1e6, abs=1e-2)
    shape = shape_of(engine.local.loaded)
    weights = cost.weight_bytes_read(shape, 1, decode=True)
    assert result["floor"]["weight_bytes"] == weights
    assert result["floor"]["floor_ms"] == pytest.approx(weights / fixed_ceilings * 1000, abs=1e-3)
    assert result["floor"]["kv_us_per_1k_positions"] == pytest.approx(shape.kv_bytes_per_token * 1000 / 1e4, abs=1e-3)


def test_line_fit():
    assert line_fit([0, 1, 2], [1, 3, 5]) == pytest.approx((1, 2))
    assert line_fit([64, 64], [3, 4]) is None  # one length: no slope to fit
    assert line_fit([5], [1]) is None


def test_the_invariance_experiment_restores_the_mode_but_not_over_a_switch_made_meanwhile(fake_app):
    """The experiment puts the mode back as it found it; a teacher who switched it during the run keeps
    their choice (the restore would otherwise undo it silently)."""
    from serving_experiments.experiments.batch_invariance import mode

    _, engine = fake_app
    local = engine.local
    assert local.batch_invariance()["on"] is False
    with mode(engine, True):
        assert local.batch_invariance()["on"] is True
    assert local.batch_invariance()["on"] is False
    with mode(engine, True):
        engine.set_policy(batch_invariant=False)  # the teacher turns it off mid-run ...
        engine.set_policy(batch_invariant=True)  # ... and on again: the mode is as the experiment set it
    assert local.batch_invariance()["on"] is False
    engine.set_policy(batch_invariant=True)  # the teacher's mode before the run: on
    with mode(engine, True):
        engine.set_policy(batch_invariant=False)  # the teacher turns it off during the run: off it stays
    assert local.batch_invariance()["on"] is False


def test_why_batch_draws_no_verdict_on_a_machine_loaded_past_its_threads(fake_app, monkeypatch):
    import os

    import torch

    app, _ = fake_app
    monkeypatch.setattr("serving_experiments.roofline.ceilings", lambda device, dtype: (1e11, 1e10))
    monkeypatch.setattr("serving_experiments.kernels.Kernels.measure", lambda self, calls: dict.fromkeys(calls, 1e-9))
    monkeypatch.setattr(os, "getloadavg", lambda: (torch.get_num_threads() + 1.0, 0.0, 0.0))
    roof = post(app, "why_batch", {"new_tokens": 3}).json["result"]["roofline"]
    assert roof["floors_consistent"] and roof["load_1m"] > roof["threads"]
    assert {p["evidence"] for p in roof["points"]} == {LOADED}
