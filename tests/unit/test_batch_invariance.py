"""Batch-invariant decoding (model_runner/local/step/invariant.py) on the test model: in the mode a request's
logits at every step are the same bits alone and among 1 to 16 others, sent together or arriving while the
others decode, prefilled whole or in chunks, greedy or seeded, with prefix caching asked for, and when the
pool is too small and requests are preempted; on float32 and on the int4 route's kernels. Also what the
mode reports, the kernel check that withholds the claim, and the scheduler's pieces."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kvscope_testkit import Recorder, ask, blocks_mb, events_of, start_engine, stop_engine, wait_until
from torch import nn

from model_runner.local.scheduler import Scheduler
from model_runner.local.step.invariant import check_kernels
from model_runner.protocol.errors import UserError
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence

PROBE = "What does a KV cache hold, in one line?"
TOKENS = 24
COMPANY = [f"company {i}: " + "tell me something " * (1 + i % 5) for i in range(16)]


def send(engine, prompts: list[str], **fields) -> list[list[dict]]:
    """Queue every prompt before any is admitted (they are first seen together); their events."""
    with engine.admissions_held():
        handles = [
            engine.submit(ask(p, max_new_tokens=TOKENS, ignore_eos=True, **fields), request_id=f"q{i}")
            for i, p in enumerate(prompts)
        ]
    return [events_of(h, 120) for h in handles]


def tokens_of(events: list[dict]) -> list[int]:
    return [e["id"] for e in events if e["type"] == "token"]


@pytest.fixture(scope="module", params=["auto", "int4"], ids=["float32", "int4-kernels"])
def engines(request):
    """(engine, recorder) in the mode on one route: the test model's float32, or its int4 kernels."""
    made = []

    def make(policy: Policy = Policy(), **config):
        mode = replace(policy, batch_invariant=True)
        engine = start_engine("fake", dtype=request.param, policy=mode, **config)
        made.append(engine)
        return engine, Recorder(engine)

    yield make
    for engine in made:
        stop_engine(engine)


def lone_and_among(engines, company: list[str], config: dict | None = None, **fields):
    """The probe's logits rows and tokens alone, then among `company` (sent together), on one engine."""
    engine, seen = engines(**(config or {}))
    lone = send(engine, [PROBE], **fields)[0]
    alone = seen.rows.pop("q0")
    among = send(engine, [PROBE, *company], **fields)[0]
    return engine, (alone, tokens_of(lone)), (seen.rows["q0"], tokens_of(among))


def assert_same_bits(alone: tuple, among: tuple) -> None:
    (rows_a, tokens_a), (rows_b, tokens_b) = alone, among
    assert tokens_a == tokens_b and len(tokens_a) == TOKENS
    assert len(rows_a) == len(rows_b) == TOKENS
    differing = [i for i, (a, b) in enumerate(zip(rows_a, rows_b)) if not torch.equal(a, b)]
    assert differing == [], f"steps whose logits differ from the lone run: {differing}"


@pytest.mark.parametrize("others", [1, 4, 16])
def test_a_greedy_request_gets_its_lone_logits_bit_for_bit_among_others(engines, others):
    engine, alone, among = lone_and_among(engines, COMPANY[:others])
    assert_same_bits(alone, among)
    assert engine.snapshot()["decode"]["mode"] == "invariant"


def test_a_seeded_sampled_request_gets_its_lone_tokens_and_logits_among_16_others(engines):
    _, alone, among = lone_and_among(engines, COMPANY, sampling={"temperature": 1.0, "seed": 7})
    assert_same_bits(alone, among)


def test_chunked_prompts_get_their_lone_logits_among_others(engines):
    policy = Policy(chunked_prefill=True, chunk_size=8)
    _, alone, among = lone_and_among(engines, COMPANY[:8], {"policy": policy})
    assert_same_bits(alone, among)


def test_a_request_arriving_while_others_decode_gets_its_lone_logits(engines):
    engine, seen = engines()
    lone = send(engine, [PROBE])[0]
    alone = seen.rows.pop("q0")
    early = [
        engine.submit(ask(p, max_new_tokens=40, ignore_eos=True), request_id=f"e{i}") for i, p in enumerate(COMPANY[:6])
    ]
    wait_until(lambda: all(len(seen.rows.get(f"e{i}", [])) >= 3 for i in range(6)), "the early requests decoding")
    probe = engine.submit(ask(PROBE, max_new_tokens=TOKENS, ignore_eos=True), request_id="q0")
    late = [engine.submit(ask(p, max_new_tokens=8), request_id=f"l{i}") for i, p in enumerate(COMPANY[6:10])]
    events = events_of(probe, 120)
    for handle in early + late:
        events_of(handle, 120)
    assert_same_bits((alone, tokens_of(lone)), (seen.rows["q0"], tokens_of(events)))


def test_prefix_caching_stays_off_in_the_mode_and_shared_prefixes_change_nothing(engines):
    engine, _ = engines()
    assert engine.policy.prefix_caching is False
    with pytest.raises(UserError, match="batch-invariant mode keeps prefix caching off") as refused:
        engine.set_policy(prefix_caching=True)
    assert refused.value.field == "prefix_caching"
    with pytest.raises(UserError, match="keeps prefix caching off"):  # however the policy is made
        Policy(batch_invariant=True, prefix_caching=True)
    system = "You are a careful assistant who answers in one line. " * 3  # a prefix of several whole blocks
    _, alone, among = lone_and_among(engines, COMPANY[:6], system=system)
    assert_same_bits(alone, among)
    assert engine.prefix_hit_tokens == 0


def test_preempted_requests_replay_their_shapes_and_keep_their_lone_logits(engines):
    # A pool of 14 blocks: 8 requests of about 3 blocks each cannot all grow, so the last admitted are preempted.
    engine, seen = engines(kv_cache_mb=blocks_mb(14))
    lone = {}
    for i, prompt in enumerate(COMPANY[:8]):
        tokens = tokens_of(send(engine, [prompt])[0])
        lone[i] = (seen.rows.pop("q0"), tokens)
    together = send(engine, COMPANY[:8])
    assert engine.preemptions > 0, "the pool was meant to be too small for all eight at once"
    for i, events in enumerate(together):
        assert_same_bits(lone[i], (seen.rows[f"q{i}"], tokens_of(events)))


def test_the_mode_reports_itself_and_what_its_claim_rests_on():
    engine = start_engine("fake", policy=Policy(batch_invariant=True))
    try:
        report = engine.batch_invariance()
        assert report["on"] is True and report["claimed"] is True and report["rows"] == engine.policy.max_num_seqs
        assert report["kernels_checked"] >= 3 and report["not_row_independent"] == []
        assert engine.snapshot()["batch_invariant"] == report
    finally:
        stop_engine(engine)
    engine = start_engine("fake")
    try:
        assert engine.batch_invariance() == {"on": False}
    finally:
        stop_engine(engine)


class PlaceDependentLinear(nn.Linear):
    """A layer whose rows depend on their place in the batch: the kind of kernel the mode cannot rest on."""

    def forward(self, x):
        return super().forward(x) + 1e-3 * torch.arange(x.shape[0], dtype=x.dtype)[:, None]


def test_the_kernel_check_withholds_the_claim_for_a_layer_whose_rows_depend_on_their_place():
    report = check_kernels(nn.Sequential(nn.Linear(8, 8), PlaceDependentLinear(8, 8)), rows=4)
    assert [check.row_independent for check in report.checks] == [True, False]
    assert report.claimed is False
    assert report.to_dict()["not_row_independent"] == ["PlaceDependentLinear 8→8"]


def seq_of(prompt: int, output: int = 0, chunk: int = 0) -> Sequence:
    seq = Sequence(id="s", params=ask("hi"), key="s", prompt_ids=list(range(prompt)), output_ids=list(range(output)))
    seq.chunk_size = chunk
    return seq


def test_the_modes_prefill_pieces_are_set_by_the_request_alone():
    scheduler = Scheduler(8, Policy(batch_invariant=True))
    whole, chunked = seq_of(40), seq_of(40, chunk=16)
    assert scheduler._chunk(whole, budget=512, first_in_step=False) == 40
    assert scheduler._chunk(chunked, budget=512, first_in_step=False) == 16
    assert scheduler._chunk(chunked, budget=5, first_in_step=False) == 0  # not cut to the company's leftovers
    assert scheduler._chunk(chunked, budget=5, first_in_step=True) == 16
    preempted = seq_of(40, output=3, chunk=16)  # the prompt in its own chunks, then the answer a token at a time
    pieces = []
    while preempted.cached < len(preempted.tokens):
        piece = scheduler._chunk(preempted, budget=512, first_in_step=True)
        pieces.append(piece)
        preempted.cached += piece
    assert pieces == [16, 16, 8, 1, 1, 1]


def test_api_model_and_metrics_say_whether_the_mode_is_on():
    from app import create_app

    for on in (True, False):
        engine = start_engine("fake", policy=Policy(batch_invariant=on))
        try:
            client = create_app({"ENGINE": engine}).test_client()
            assert client.get("/api/model").json["batch_invariant"] == engine.batch_invariance()
            assert client.get("/api/model").json["batch_invariant"]["on"] is on
            scrape = client.get("/metrics").get_data(as_text=True)
            assert f'kvscope:batch_invariant{{model_name="fake"}} {1.0 if on else 0.0}' in scrape
        finally:
            stop_engine(engine)


def test_the_policy_route_switches_the_mode_the_next_step_runs_in():
    # The policy route, the class's switch and `serve --batch-invariant` all set the one policy field.
    from app import create_app

    engine = start_engine("fake")
    try:
        client = create_app({"TESTING": True, "ENGINE": engine}).test_client()
        assert engine.snapshot()["decode"]["mode"] == "eager"
        answer = client.post("/api/engine/policy", json={"batch_invariant": True})
        assert answer.status_code == 200 and answer.json["policy"]["batch_invariant"] is True
        events = events_of(engine.submit(ask(PROBE, max_new_tokens=4, ignore_eos=True)), 60)
        assert events[-1]["type"] == "finished"
        assert engine.snapshot()["decode"]["mode"] == "invariant"
        assert engine.batch_invariance()["on"] is True and engine.batch_invariance()["claimed"] is True
        refused = client.post("/api/engine/policy", json={"prefix_caching": True})
        assert refused.status_code == 400 and refused.json["field"] == "prefix_caching"  # the API's error shape
        assert client.post("/api/engine/policy", json={"batch_invariant": False}).status_code == 200
        events_of(engine.submit(ask(PROBE, max_new_tokens=2)), 60)
        assert engine.snapshot()["decode"]["mode"] == "eager" and engine.batch_invariance() == {"on": False}
    finally:
        stop_engine(engine)


def test_the_serve_flag_turns_prefix_caching_off_and_refuses_it_asked_for():
    from kvscope.cli import batch_invariant_policy, build_parser

    args = build_parser().parse_args(["serve", "--batch-invariant"])
    assert args.batch_invariant is True
    assert batch_invariant_policy(args, {"prefix_caching": True, "chunked_prefill": True}, None) == {
        "prefix_caching": False,  # a class's default policy, say, yields to the mode
        "chunked_prefill": True,
        "batch_invariant": True,
    }
    asked = build_parser().parse_args(["serve", "--batch-invariant", "--prefix-caching"])
    with pytest.raises(UserError, match="keeps prefix caching off") as refused:
        batch_invariant_policy(asked, {"prefix_caching": True}, None)
    assert refused.value.field == "prefix_caching"
    with pytest.raises(UserError, match="not of --engine"):
        batch_invariant_policy(args, {}, {"ENGINE_URL": "http://gpu-box:8000"})
    assert build_parser().parse_args(["bench", "--batch-invariant"]).batch_invariant is True
