"""The static-shape decode step (local/step/static_step.py) on the test model, on the CPU: buckets are powers
of two and bounded; its device-built mask is build_attention_mask's for decode rows; at the batch's own
shapes it gives the eager step's logits bit for bit; at one fixed shape a row's logits and KV writes are
the same bit for bit whatever the other rows hold (padding, other requests, their lengths); padding rows
or keys (another shape) change the logits by rounding only (tests/numerics.py) and write nothing outside
the trash; an engine running it gives the same events and KV figures as the eager one; a batch wider
than its buffers, or a failed graph capture, runs without it instead of failing (local/step/graphs.py)."""

from __future__ import annotations

import pytest
import torch
from kvscope_testkit import ask, events_of
from numerics import assert_same_choices, assert_within_rounding, logit_tolerance
from transformers.generation.continuous_batching.utils import build_attention_mask

import model_runner.local.step.static_step as static_step
from model_runner.loading import loader
from model_runner.local.config import POLICY
from model_runner.local.kv_cache import FULL, PagedKVPool
from model_runner.local.model.decoders import decoder_for
from model_runner.local.scheduler import Work
from model_runner.local.step import graphs
from model_runner.local.step.forward import BatchForward
from model_runner.local.step.static_step import MIN_KEYS, Bucket, StaticDecodeStep, bucket_for, decode_mask
from model_runner.shared.sequence import Sequence

PROMPTS = [5, 12, 19]  # prompt lengths: three requests whose pasts differ, one across a block boundary
DECODES = 20


@pytest.fixture(scope="module")
def loaded():
    return loader.load("fake", "cpu", "auto")


def test_buckets_are_powers_of_two_with_a_floor_on_keys_and_none_past_the_buffers():
    assert [bucket_for(n, 10, 16, 4096).rows for n in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    assert bucket_for(3, 10, 16, 4096).keys == MIN_KEYS
    assert bucket_for(3, 300, 16, 4096).keys == 512
    assert bucket_for(17, 10, 16, 4096) is None and bucket_for(2, 5000, 16, 4096) is None


def test_the_device_mask_is_build_attention_masks_for_decode_rows_and_padding_sees_nothing():
    cu_keys = [0, 4, 9, 16]
    expected = torch.full((1, 1, 3, 16), torch.finfo(torch.float32).min)
    build_attention_mask(expected, [0, 1, 2, 3], cu_keys)
    padded = decode_mask(torch.tensor(cu_keys + [16]), 20, torch.float32)  # a fourth, padding row; 4 padding keys
    assert torch.equal(padded[..., :3, :16], expected)
    assert (padded[..., :, 16:] == torch.finfo(torch.float32).min).all()  # no row sees a padding key
    assert (padded[..., 3, :] == torch.finfo(torch.float32).min).all()  # the padding row sees no key


def decode_run(loaded, mode: str, steps: int = DECODES, decoder: str = "auto"):
    """Three requests prefilled, then `steps` decode steps together → (logits per step, forward, pool); the
    pool's `requests` are the three sequences."""
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    forward = BatchForward(loaded.model, pool, decoder_for(loaded.model, pool, decoder), cuda_graphs=mode)
    seqs = [
        Sequence(id=f"s{i}", params=ask("hi"), key=f"s{i}", prompt_ids=list(range(3, 3 + n)))
        for i, n in enumerate(PROMPTS)
    ]
    out = []
    with torch.inference_mode():
        for seq in seqs:
            run_work(pool, forward, [Work(seq, seq.prompt_ids, "prefill", True)])
        for t in range(steps):
            out.append(run_work(pool, forward, [Work(seq, [40 + t], "decode", True) for seq in seqs]))
    pool.requests = seqs
    return torch.stack(out), forward, pool


def run_work(pool: PagedKVPool, forward: BatchForward, work: list[Work]) -> torch.Tensor:
    """One step as the engine runs it: blocks reserved, the write check armed and verified."""
    for w in work:
        assert pool.reserve(w.seq, len(w.tokens))
    complete = pool.completing_step([(w.seq, len(w.tokens)) for w in work])
    logits = forward(work)
    pool.completed_step([w.seq for w in work], complete)
    return logits


def data_rows(pool: PagedKVPool) -> torch.Tensor:
    """The pool's flat tensor without its two leading trash sectors (where padding reads and writes)."""
    return pool.cache.cache_tensor[2 * pool.cache.bytes_per_sector :]


def test_at_the_batchs_own_shapes_the_static_step_is_the_eager_step_bit_for_bit(loaded, monkeypatch):
    # transformers' eager decode runs the packed batch, as the static step does (the native step's static step
    # is transformers' bit for bit: tests/unit/test_native_decoder.py; its eager decode attends row by row).
    eager, _, eager_pool = decode_run(loaded, "off", decoder="transformers")
    monkeypatch.setattr(static_step, "bucket_for", lambda rows, keys, *_: Bucket(rows, keys))
    exact, forward, pool = decode_run(loaded, "padded", decoder="transformers")
    assert forward.report() == {"mode": "padded", "static_steps": DECODES}
    assert torch.equal(exact, eager) and torch.equal(data_rows(pool), data_rows(eager_pool))
    assert pool.writes.failed == 0 and pool.writes.checked == eager_pool.writes.checked
    native, _, native_pool = decode_run(loaded, "off", decoder="native")  # row by row: within float32's rounding
    assert_within_rounding(native.flatten(0, 1), eager.flatten(0, 1))
    assert native_pool.writes.failed == 0 and native_pool.writes.checked == eager_pool.writes.checked


# ---- neighbour independence: at one shape, bit for bit ------------------------------------------------

FIXED = Bucket(8, 512)  # every step below runs at this shape, whoever fills the rows after the first three
COMPANIONS = {  # what the five rows after the three requests hold: (prompt lengths, first token id)
    "five other requests": ([3, 9, 14, 6, 11], 60),
    "five other requests of other lengths": ([21, 2, 8, 30, 4], 90),
}


def subjects_at_a_fixed_shape(loaded, companions=(), first_id=0, scribble=False):
    """The three requests of decode_run (rows 0-2: the same rows, pasts and key offsets in every run) decoding
    beside `companions` (prompt lengths of requests in rows 3-7) or padding (scribbled on when `scribble`),
    every step at FIXED → (their logits per step, their KV rows, the pool)."""
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    forward = BatchForward(loaded.model, pool, decoder_for(loaded.model, pool), cuda_graphs="padded")
    subjects = [
        Sequence(id=f"s{i}", params=ask("hi"), key=f"s{i}", prompt_ids=list(range(3, 3 + n)))
        for i, n in enumerate(PROMPTS)
    ]
    others = [
        Sequence(id=f"o{i}", params=ask("hi"), key=f"o{i}", prompt_ids=list(range(first_id + i, first_id + i + n)))
        for i, n in enumerate(companions)
    ]
    if scribble:
        scribble_on_padding(forward.static)
    out = []
    with torch.inference_mode():
        for seq in subjects + others:
            run_work(pool, forward, [Work(seq, seq.prompt_ids, "prefill", True)])
        for t in range(DECODES):
            work = [Work(seq, [40 + t], "decode", True) for seq in subjects]
            work += [Work(seq, [first_id + 7 * t + i], "decode", True) for i, seq in enumerate(others)]
            out.append(run_work(pool, forward, work)[: len(subjects)])
    assert forward.static_steps == DECODES and pool.writes.failed == 0
    return torch.stack(out), kv_rows(pool, subjects), pool


def scribble_on_padding(step: StaticDecodeStep) -> None:
    """After each fill, the padding rows' token ids and positions hold other values (their writes stay the
    trash slot's and their key ranges empty, as fill sets them): what padding holds must not matter."""
    fill = step.fill

    def fill_then_scribble(rows, min_rows=1):
        bucket = fill(rows, min_rows)
        pad = slice(len(rows), bucket.rows)
        step._view("ids", bucket.rows, step.host)[pad] = torch.arange(bucket.rows - len(rows)) * 37 + 101
        step._view("positions", bucket.rows, step.host)[pad] = torch.arange(bucket.rows - len(rows)) * 53 + 7
        return bucket

    step.fill = fill_then_scribble


def kv_row_indices(pool: PagedKVPool, seqs: list[Sequence]) -> torch.Tensor:
    """The pool rows (one K or V row of one layer each) holding `seqs`' cached positions: [positions, pages]."""
    alloc = pool.cache.cache_allocators[FULL]
    size = pool.block_size
    firsts = [
        pool.blocks_of(s)[p // size] * alloc.block_physical_stride + p % size for s in seqs for p in range(s.cached)
    ]
    return torch.tensor(firsts)[:, None] + torch.arange(2 * len(alloc.layer_indices))[None, :] * size


def kv_rows(pool: PagedKVPool, seqs: list[Sequence]) -> torch.Tensor:
    return pool.rows[kv_row_indices(pool, seqs)]


def rows_outside(pool: PagedKVPool, seqs: list[Sequence]) -> torch.Tensor:
    """Every row of the pool's data (its trash sectors left out) that holds none of `seqs`' positions."""
    keep = torch.ones(pool.rows.shape[0], dtype=torch.bool)
    keep[kv_row_indices(pool, seqs).reshape(-1)] = False
    keep[: 2 * pool.cache.bytes_per_sector // pool.rows[0].nbytes] = False
    return pool.rows[keep]


@pytest.fixture(scope="module")
def beside_padding(loaded):
    """The three requests beside padding only: what every other run at FIXED must reproduce."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(static_step, "bucket_for", lambda *_: FIXED)
        return subjects_at_a_fixed_shape(loaded)


@pytest.mark.parametrize("companions", sorted(COMPANIONS))
def test_a_rows_logits_and_kv_do_not_depend_on_the_other_requests_beside_it(
    loaded, beside_padding, monkeypatch, companions
):
    """Rows 3-7 hold other requests (their own pasts, lengths and tokens) instead of padding: rows 0-2 read
    and write exactly what they did beside padding. Any difference is one request's state reaching another."""
    monkeypatch.setattr(static_step, "bucket_for", lambda *_: FIXED)
    lengths, first_id = COMPANIONS[companions]
    logits, kv, _ = subjects_at_a_fixed_shape(loaded, lengths, first_id)
    alone_logits, alone_kv, _ = beside_padding
    assert torch.equal(logits, alone_logits) and torch.equal(kv, alone_kv)


def test_a_rows_logits_and_kv_do_not_depend_on_what_the_padding_holds(loaded, beside_padding, monkeypatch):
    monkeypatch.setattr(static_step, "bucket_for", lambda *_: FIXED)
    logits, kv, pool = subjects_at_a_fixed_shape(loaded, scribble=True)
    alone_logits, alone_kv, alone_pool = beside_padding
    assert torch.equal(logits, alone_logits) and torch.equal(kv, alone_kv)
    assert torch.equal(data_rows(pool), data_rows(alone_pool))  # the padding wrote to the trash only


# ---- another row count or key width: within rounding ---------------------------------------------------


@pytest.mark.parametrize("rows", [8, 16])
def test_padding_rows_change_the_real_rows_by_rounding_only_and_write_only_to_the_trash(loaded, monkeypatch, rows):
    """3 rows padded to 8 or 16 against the eager step's 3: the CPU's GEMM blocks 3 rows and 8 differently
    (AVX2 kernels, and AMD's AVX-512 ones at 8), so the sums round differently; nothing outside the three
    requests' positions is written, bit for bit."""
    eager, _, eager_pool = decode_run(loaded, "off")
    monkeypatch.setattr(static_step, "bucket_for", lambda _, keys, *__: Bucket(rows, keys))
    padded, _, pool = decode_run(loaded, "padded")
    assert_within_rounding(padded, eager)
    assert torch.equal(rows_outside(pool, pool.requests), rows_outside(eager_pool, eager_pool.requests))
    kv, eager_kv = kv_rows(pool, pool.requests), kv_rows(eager_pool, eager_pool.requests)
    # A K or V row is a projection's float32 sums over the same inputs: the same allowance as a logit's.
    torch.testing.assert_close(kv, eager_kv, rtol=0, atol=logit_tolerance(torch.float32, float(eager_kv.abs().max())))
    assert pool.writes.failed == 0


def test_padded_keys_change_the_logits_by_rounding_only_and_no_decided_token(loaded):
    eager, _, eager_pool = decode_run(loaded, "off")
    padded, forward, pool = decode_run(loaded, "padded")  # 3 rows → 4, keys → 256
    assert forward.static_steps == DECODES and eager.abs().max() < FAKE_LOGIT_MAGNITUDE
    assert_within_rounding(padded, eager)
    assert pool.usage() == eager_pool.usage() and pool.writes.failed == 0


def test_a_batch_wider_than_the_buffers_runs_eagerly(loaded):
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    narrow = StaticDecodeStep(loaded.model, pool, decoder_for(loaded.model, pool), max_rows=2)
    seqs = [Sequence(id=f"w{i}", params=ask("hi"), key=f"w{i}", prompt_ids=[3, 4, 5]) for i in range(3)]
    with torch.inference_mode():
        forward = BatchForward(loaded.model, pool, decoder_for(loaded.model, pool), cuda_graphs="padded")
        forward.static = narrow
        for seq in seqs:
            run_work(pool, forward, [Work(seq, seq.prompt_ids, "prefill", True)])
        logits = run_work(pool, forward, [Work(seq, [9], "decode", True) for seq in seqs])
    assert logits.shape[0] == 3 and forward.static_steps == 0  # three rows: not in a two-row buffer
    assert [seq.cached for seq in seqs] == [4, 4, 4] and pool.writes.failed == 0


def test_a_failed_capture_runs_the_bucket_without_a_graph(loaded, monkeypatch):
    """CUDA is not here: the capture's first CUDA call fails, as a capture can on a GPU, and the step runs."""
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    step = StaticDecodeStep(loaded.model, pool, decoder_for(loaded.model, pool))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    decode_graphs = graphs.DecodeGraphs(step)
    seq = Sequence(id="g", params=ask("hi"), key="g", prompt_ids=[3, 4, 5])
    eager = BatchForward(loaded.model, pool, decoder_for(loaded.model, pool), cuda_graphs="off")
    with torch.inference_mode():
        run_work(pool, eager, [Work(seq, seq.prompt_ids, "prefill", True)])
        assert pool.reserve(seq, 1)
        bucket = step.fill([Work(seq, [9], "decode", True)])
        logits = decode_graphs.run(bucket)
        again = decode_graphs.run(bucket)  # the failed bucket is not captured again
    assert logits.shape == (1, loaded.model.config.vocab_size) and torch.equal(logits, again)
    report = decode_graphs.report()
    assert report["failed"] == 1 and report["captured"] == 0 and report["last_failure"]


def test_graphs_are_wanted_on_cuda_only_and_a_bad_mode_is_named():
    assert not graphs.graphs_wanted("auto", torch.device("cpu"))
    assert not graphs.graphs_wanted("off", torch.device("cuda"))
    with pytest.raises(ValueError, match="cuda_graphs must be one of auto, off, padded"):
        graphs.graphs_wanted("always", torch.device("cpu"))


FAKE_LOGIT_MAGNITUDE = 7.0  # the test model's logits stay below 7 (6.2 measured): its untrained ones plus a steer of 6


def comparable(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """A request's events without their clock readings, ids and choices (what two runs may differ in), and
    apart from them the choices: a padded key width rounds the softmax differently in the last bits."""
    clocks = {"request_id", "t_ms", "ms", "step_ms", "tokens_per_s", "metrics", "queue_ms", "waited_ms"}
    choices = [e if e["type"] == "token" else e["first_token"] for e in events if e["type"] in ("token", "prefill_end")]
    scrub = {"id", "text", "prob", "candidates", "first_token"}
    shown = [{k: v for k, v in e.items() if k not in clocks | scrub} for e in events]
    return shown, choices


@pytest.mark.parametrize(
    "policy",
    [{}, {"chunked_prefill": True, "chunk_size": 16, "prefix_caching": True}],
    ids=["default", "chunked-prefix-cached"],
)
def test_an_engine_on_the_padded_step_gives_the_eager_engines_events(engine_factory, policy):
    """Also with chunks beside decodes (those steps run eagerly) and shared prefix blocks (read by each row):
    the same events and KV figures, the same tokens (each decided far beyond rounding), probabilities within it."""
    questions = ["Tell me about caches.", "Name three colours.", "Why is the sky blue?"]
    runs = {}
    for mode in ("off", "padded"):
        engine = engine_factory("fake", cuda_graphs=mode, policy=POLICY.updated(policy))
        with engine.admissions_held():  # all three start together and decode in shared steps
            handles = [engine.submit(ask(q, max_new_tokens=24), f"{mode}-{i}") for i, q in enumerate(questions)]
        runs[mode] = ([comparable(events_of(h)) for h in handles], engine.snapshot())
    (eager, eager_snap), (padded, padded_snap) = runs["off"], runs["padded"]
    tolerance = logit_tolerance(torch.float32, FAKE_LOGIT_MAGNITUDE)
    for (_, want), (_, got) in zip(eager, padded):
        assert_same_choices(got, want, tolerance)
    assert [shown for shown, _ in padded] == [shown for shown, _ in eager]  # text, KV figures, batches
    tokens = [e for shown, _ in padded for e in shown if e.get("type") == "token"]
    assert tokens and all(e["cache_bytes_measured"] == e["cache_bytes_formula"] for e in tokens)
    assert max(e["batch_size"] for e in tokens) == 3
    assert padded_snap["decode"]["mode"] == "padded" and padded_snap["decode"]["static_steps"] > 0
    assert eager_snap["decode"] == {"mode": "eager", "static_steps": 0}
    assert padded_snap["kv"] == eager_snap["kv"] and padded_snap["steps"] == eager_snap["steps"]


def test_serve_takes_cuda_graphs_auto_or_off_and_names_the_choices():
    from kvscope.cli import build_parser

    assert build_parser().parse_args(["serve"]).cuda_graphs == "auto"
    assert build_parser().parse_args(["serve", "--cuda-graphs", "off"]).cuda_graphs == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--cuda-graphs", "always"])
