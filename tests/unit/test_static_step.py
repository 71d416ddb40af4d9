"""The static-shape decode step (core/static_step.py) on the test model, on the CPU: buckets are powers
of two and bounded; its device-built mask is build_attention_mask's for decode rows; at the batch's own
shapes it gives the eager step's logits bit for bit, padded rows change nothing in the pool outside its
trash sectors, padded keys change the logits by rounding only; an engine running it gives the same
events and KV figures as the eager one; a batch wider than its buffers, or a failed graph capture, runs
without it instead of failing (core/graphs.py)."""

from __future__ import annotations

import pytest
import torch
from kvscope_testkit import ask, events_of
from transformers.generation.continuous_batching.utils import build_attention_mask

import model_runner.local.static_step as static_step
from model_runner.loading import loader
from model_runner.local import graphs
from model_runner.local.config import POLICY
from model_runner.local.forward import BatchForward
from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.scheduler import Work
from model_runner.local.static_step import MIN_KEYS, Bucket, StaticDecodeStep, bucket_for, decode_mask
from model_runner.shared.sequence import Sequence

pytestmark = pytest.mark.usefixtures("one_torch_thread")
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


def decode_run(loaded, mode: str, steps: int = DECODES):
    """Three requests prefilled, then `steps` decode steps together → (logits per step, forward, pool)."""
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    forward = BatchForward(loaded.model, pool, cuda_graphs=mode)
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
    eager, _, eager_pool = decode_run(loaded, "off")
    monkeypatch.setattr(static_step, "bucket_for", lambda rows, keys, *_: Bucket(rows, keys))
    exact, forward, pool = decode_run(loaded, "padded")
    assert forward.report() == {"mode": "padded", "static_steps": DECODES}
    assert torch.equal(exact, eager) and torch.equal(data_rows(pool), data_rows(eager_pool))
    assert pool.writes.failed == 0 and pool.writes.checked == eager_pool.writes.checked


def test_padding_rows_write_only_to_the_trash(loaded, monkeypatch):
    eager, _, eager_pool = decode_run(loaded, "off")
    monkeypatch.setattr(static_step, "bucket_for", lambda rows, keys, *_: Bucket(8, keys))  # 3 rows + 5 padding
    padded, _, pool = decode_run(loaded, "padded")
    assert torch.equal(padded, eager)  # rows are independent: the padding changes no real row
    assert torch.equal(data_rows(pool), data_rows(eager_pool)) and pool.writes.failed == 0


def test_padded_keys_change_the_logits_by_rounding_only_and_no_token(loaded):
    eager, _, eager_pool = decode_run(loaded, "off")
    padded, forward, pool = decode_run(loaded, "padded")  # 3 rows → 4, keys → 256
    assert forward.static_steps == DECODES
    torch.testing.assert_close(padded, eager, rtol=0, atol=1e-5)
    assert torch.equal(padded.argmax(-1), eager.argmax(-1))
    assert pool.usage() == eager_pool.usage() and pool.writes.failed == 0


def test_a_batch_wider_than_the_buffers_runs_eagerly(loaded):
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    narrow = StaticDecodeStep(loaded.model, pool, max_rows=2)
    seqs = [Sequence(id=f"w{i}", params=ask("hi"), key=f"w{i}", prompt_ids=[3, 4, 5]) for i in range(3)]
    with torch.inference_mode():
        forward = BatchForward(loaded.model, pool, cuda_graphs="padded")
        forward.static = narrow
        for seq in seqs:
            run_work(pool, forward, [Work(seq, seq.prompt_ids, "prefill", True)])
        logits = run_work(pool, forward, [Work(seq, [9], "decode", True) for seq in seqs])
    assert logits.shape[0] == 3 and forward.static_steps == 0  # three rows: not in a two-row buffer
    assert [seq.cached for seq in seqs] == [4, 4, 4] and pool.writes.failed == 0


def test_a_failed_capture_runs_the_bucket_without_a_graph(loaded, monkeypatch):
    """CUDA is not here: the capture's first CUDA call fails, as a capture can on a GPU, and the step runs."""
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=256)
    step = StaticDecodeStep(loaded.model, pool)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    decode_graphs = graphs.DecodeGraphs(step)
    seq = Sequence(id="g", params=ask("hi"), key="g", prompt_ids=[3, 4, 5])
    eager = BatchForward(loaded.model, pool, cuda_graphs="off")
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


def comparable(events: list[dict]) -> tuple[list[dict], list[float]]:
    """A request's events without their clock readings and ids (what two runs may differ in), and apart
    from them the probabilities shown: a padded key width rounds the softmax differently in the last bits."""
    clocks = {"request_id", "t_ms", "ms", "step_ms", "tokens_per_s", "metrics", "queue_ms", "waited_ms"}
    probs = []
    for e in events:
        if e["type"] in ("token", "prefill_end"):
            choice = e if e["type"] == "token" else e["first_token"]
            probs += [choice["prob"]] + [c["prob"] for c in choice["candidates"]]
    scrub = {"prob", "candidates", "first_token"}
    shown = [{k: v for k, v in e.items() if k not in clocks | scrub} for e in events]
    ids = [
        [c["id"] for c in (e if e["type"] == "token" else e["first_token"])["candidates"]]
        for e in events
        if e["type"] in ("token", "prefill_end")
    ]
    return shown + [{"candidate_ids": ids}], probs


@pytest.mark.parametrize(
    "policy",
    [{}, {"chunked_prefill": True, "chunk_size": 16, "prefix_caching": True}],
    ids=["default", "chunked-prefix-cached"],
)
def test_an_engine_on_the_padded_step_gives_the_eager_engines_events(engine_factory, policy):
    """Also with chunks beside decodes (those steps run eagerly) and shared prefix blocks (read by each row)."""
    questions = ["Tell me about caches.", "Name three colours.", "Why is the sky blue?"]
    runs = {}
    for mode in ("off", "padded"):
        engine = engine_factory("fake", cuda_graphs=mode, policy=POLICY.updated(policy))
        with engine.admissions_held():  # all three start together and decode in shared steps
            handles = [engine.submit(ask(q, max_new_tokens=24), f"{mode}-{i}") for i, q in enumerate(questions)]
        runs[mode] = ([comparable(events_of(h)) for h in handles], engine.snapshot())
    (eager, eager_snap), (padded, padded_snap) = runs["off"], runs["padded"]
    assert [shown for shown, _ in padded] == [shown for shown, _ in eager]  # tokens, text, KV figures, batches
    for (_, a), (_, b) in zip(eager, padded):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=0, atol=1e-5)
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
