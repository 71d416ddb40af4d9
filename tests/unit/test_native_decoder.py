"""The native decoder step (model_runner/local/model/native.py) against transformers' forward over the same paged
pool: bit for bit wherever the two run the same shapes (prompts, chunks, a lone decode, the padded static step,
batch-invariant mode), the same K and V written to the same slots, the same attention summaries; a decode step
of several rows, which the native step attends row by row, within float32's rounding of the packed one; a
decode step on int4 kernels, which calls them directly, the module path's bits; the Llama family it knows
(Llama, Qwen2's biases, Qwen3's head norms) and a clear refusal of what it does not."""

from __future__ import annotations

import pytest
import torch
from decoder_runs import Run, int4_llama, step_shape, tiny
from kvscope_testkit import ask
from numerics import assert_within_rounding

from model_runner.loading import loader
from model_runner.local.engine import Engine, EngineConfig
from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.model.decoders import decoder_for, decoder_report
from model_runner.local.model.native import PACKED, ROW_BY_ROW, DecodeRows, NativeLlama, native_support
from model_runner.local.model.paged_step import rows_apart_pay
from model_runner.local.step.invariant import InvariantSteps
from model_runner.protocol.errors import UserError

BLOCK = 16  # tokens per block of the pools made here


def fake_model():
    return loader.load("fake", "cpu", "auto").model


FAMILIES = {
    "llama (the fake model)": lambda: fake_model(),
    "llama, head_dim 16 of hidden 32 over 4 heads": lambda: tiny("llama", head_dim=16),
    "llama with attention and MLP biases": lambda: tiny("llama", attention_bias=True, mlp_bias=True),
    "llama, llama3 rope scaling": lambda: tiny(
        "llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),  # fmt: skip
    "llama, yarn rope scaling": lambda: tiny(
        "llama", rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    ),
    "qwen2 (q, k, v biases)": lambda: tiny("qwen2"),
    "qwen3 (head norms), head_dim 16": lambda: tiny("qwen3", head_dim=16),
}


# Steps whose shapes both decoders run alike: prompts packed together (few and short: the rule keeps them packed,
# checked below), a chunk after a past, lone decodes.
SAME_SHAPES = [
    [("a", [5, 6, 7, 8, 9]), ("b", [11, 12, 13])],  # two prompts in one packed step
    [("a", [20, 21, 22])],  # a chunk of three after a past of five
    [("a", [30])],  # a lone decode
    [("b", [31])],
    [("a", [32])],
]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_native_logits_and_kv_are_transformers_bits_at_the_same_shapes(family):
    model = FAMILIES[family]()
    native, reference = Run(model, "native"), Run(model, "transformers")
    assert native.forward.decoder.name == "native" and reference.forward.decoder.name == "transformers"
    assert not rows_apart_pay(step_shape([(5, 5), (3, 3)]))  # SAME_SHAPES' first step stays packed
    for rows in SAME_SHAPES:
        assert torch.equal(native.step(rows), reference.step(rows)), rows
    for key in ("a", "b"):
        assert torch.equal(native.kv(key), reference.kv(key))


def test_a_decode_step_of_several_rows_is_within_float32_rounding_and_keeps_each_row_to_itself():
    model = fake_model()
    native, reference = Run(model, "native"), Run(model, "transformers")
    prompts = [("a", list(range(40, 60))), ("b", [3, 4]), ("c", list(range(70, 79)))]
    assert not rows_apart_pay(step_shape([(20, 20), (2, 2), (9, 9)]))  # the prompts' step: packed in both
    for run in (native, reference):
        run.step(prompts)
    decode = [("a", [1]), ("b", [2]), ("c", [3])]
    got, want = native.step(decode), reference.step(decode)
    assert_within_rounding(got, want)  # row by row over gathered keys vs the packed batch's mask
    for key in ("a", "b", "c"):
        kv_native, kv_reference = native.kv(key), reference.kv(key)  # [layers·2, positions, kv_heads, d]
        assert torch.equal(kv_native[:, :-1], kv_reference[:, :-1])  # the prompts' rows: the same step, the same bits
        assert torch.equal(kv_native[:2], kv_reference[:2])  # layer 0's K and V come before any attention
        torch.testing.assert_close(kv_native, kv_reference, rtol=0, atol=1e-5)  # later layers: after attention


def test_a_step_of_prompts_attends_each_over_its_own_keys_within_rounding_of_the_packed_batch(monkeypatch):
    model = fake_model()
    native, reference = Run(model, "native", blocks=64), Run(model, "transformers", blocks=64)
    keys_seen = []  # the key count of each attention call the native step makes
    attend = NativeLlama._attend
    monkeypatch.setattr(
        NativeLlama, "_attend", lambda self, q, k, v, m: keys_seen.append(k.shape[2]) or attend(self, q, k, v, m)
    )
    prompts = [("a", list(range(1, 101))), ("b", list(range(40, 240))), ("c", list(range(1, 201)))]
    got, want = native.step(prompts), reference.step(prompts)
    assert keys_seen == [100, 200, 200] * 2  # each prompt over its own keys, in both layers; packed: [500, 500]
    assert_within_rounding(got, want)
    for key in "abc":
        kv_native, kv_reference = native.kv(key), reference.kv(key)
        assert torch.equal(kv_native[:2], kv_reference[:2])  # layer 0's K and V come before any attention
        torch.testing.assert_close(kv_native, kv_reference, rtol=0, atol=1e-5)
    keys_seen.clear()  # a chunk after its past beside two decode rows: each row over its own past and new keys
    rows = [("a", list(range(1, 97))), ("b", [5]), ("c", [6])]
    got, want = native.step(rows), reference.step(rows)
    assert keys_seen == [196, 201, 201] * 2
    assert_within_rounding(got, want)


@pytest.mark.parametrize(
    ("rows", "apart"),
    [
        ([(64, 64)] * 8, True),  # eight prompts packed: 512 × 512 pairs scored, 8 × 64 × 64 used
        ([(64, 64)] * 4, True),  # 12,288 pairs saved a row
        ([(64, 64)] * 3, True),  # 8,192 a row: the count itself
        ([(32, 32)] * 4, False),  # 3,072 a row: the calls would cost more than they save
        ([(64, 64)] * 2, False),  # 4,096 a row
        ([(5, 5), (3, 3)], False),  # 15 pairs saved a row
        ([(100, 100), (101, 101)], True),  # 10,100 a row, the lengths unequal
        ([(1000, 1000), (4, 4)], False),  # a long prompt beside a short one: 4,000 a row
        ([(96, 196), (1, 201), (1, 201)], True),  # a chunk after its past beside decode rows
        ([(64, 64)], False),  # one row: the packed call is its own
        ([(1, 400), (1, 300)], False),  # one-token rows: DecodeRows' (or the padded static step's)
    ],
)
def test_rows_are_attended_apart_where_the_pairs_saved_pay_for_the_calls(rows, apart):
    assert rows_apart_pay(step_shape(rows)) is apart
    assert rows_apart_pay(step_shape(rows, device="meta")) is False  # off the CPU: the packed call


def test_batch_invariant_mode_inspection_and_decode_rows_come_before_the_rule():
    prompts = [(100, 100)] * 3  # rows the rule sends apart
    assert NativeLlama._attention(step_shape(prompts)) == ROW_BY_ROW
    assert NativeLlama._attention(step_shape(prompts, probe=object())) == PACKED  # the probe reads packed bits
    assert NativeLlama._attention(step_shape([(5, 5), (3, 3)], row_by_row=True)) == ROW_BY_ROW  # packed by the rule
    assert NativeLlama._attention(step_shape([(1, 100)] * 3, decode_rows=True)) is DecodeRows
    assert NativeLlama._attention(step_shape([(5, 5), (3, 3)])) == PACKED


def test_a_decode_rows_result_does_not_depend_on_what_the_other_rows_hold():
    model = fake_model()
    first, second = Run(model, "native"), Run(model, "native")
    first.step([("a", list(range(40, 52))), ("b", list(range(10, 22)))])
    second.step([("a", list(range(40, 52))), ("b", list(range(90, 102)))])  # b: other tokens, the same length
    a_first = first.step([("a", [1]), ("b", [2])])[0]
    a_second = second.step([("a", [1]), ("b", [9])])[0]
    assert torch.equal(a_first, a_second)


@pytest.mark.parametrize(
    "rows, kv_heads, one_gather",
    [(1, 2, True), (3, 2, True), (3, 4, True), (3, 2, False)],
    ids=["one row", "three rows", "three rows, a key head a query head", "three rows, keys and values apart"],
)
def test_a_decode_step_on_int4_kernels_calls_them_directly_with_the_modules_bits(
    monkeypatch, rows, kv_heads, one_gather
):
    model = int4_llama(kv_heads)
    direct, modules = Run(model, "native"), Run(model, "native")
    assert direct.forward.decoder.v_after_k == BLOCK  # the pool's layout: one gather reads a row's keys and values
    if not one_gather:
        direct.forward.decoder.v_after_k = None  # a layout with no fixed distance: a gather each
    decode_layers = []
    lean = NativeLlama._decode_layer
    monkeypatch.setattr(NativeLlama, "_decode_layer", lambda *a: decode_layers.append(1) or lean(*a))
    prompts = [(key, list(range(10 * i + 5, 10 * i + 12 + 3 * i))) for i, key in enumerate("abc"[:rows])]
    for run in (direct, modules):
        run.step(prompts)
    assert not decode_layers  # a prompt's step runs the modules
    for step in range(4):
        decode = [(key, [40 + step + i]) for i, key in enumerate("abc"[:rows])]
        got = direct.step(decode)
        assert len(decode_layers) == 2 * (step + 1)  # each of the two layers, every decode step
        with monkeypatch.context() as m:
            m.setattr(NativeLlama, "_on_decode_kernels", lambda *a: False)
            want = modules.step(decode)
        assert torch.equal(got, want), step
    for key in "abc"[:rows]:
        assert torch.equal(direct.kv(key), modules.kv(key))


def test_the_padded_static_step_and_batch_invariant_mode_are_transformers_bits():
    model = fake_model()
    for mode in ({"cuda_graphs": "padded"}, {"invariant_rows": 4}):
        native, reference = Run(model, "native", **mode), Run(model, "transformers", **mode)
        prompts = [("a", [5, 6, 7, 8]), ("b", [9, 10])]
        assert torch.equal(native.step(prompts), reference.step(prompts))
        for _ in range(3):
            rows = [("a", [1]), ("b", [2])]
            assert torch.equal(native.step(rows), reference.step(rows)), mode
        assert native.forward.static_steps == reference.forward.static_steps > 0


def test_batch_invariant_mode_runs_the_native_step_row_by_row(monkeypatch):
    model = fake_model()
    native = Run(model, "native", invariant_rows=4)
    assert isinstance(native.forward.invariant, InvariantSteps)
    rows_alone = []  # each call of the native step's row-by-row attention (a layer of a step in the mode)
    attend_rows = NativeLlama._attend_rows
    monkeypatch.setattr(NativeLlama, "_attend_rows", lambda *a: rows_alone.append(1) or attend_rows(*a))
    native.step([("a", [5, 6, 7, 8])])
    native.step([("b", [9 + i % 200 for i in range(300)])])  # a long past: another key bucket than a's alone
    alone = Run(model, "native", invariant_rows=4)
    alone.step([("a", [5, 6, 7, 8])])
    assert torch.equal(native.step([("a", [1]), ("b", [2])])[0], alone.step([("a", [1])])[0])
    assert len(rows_alone) == 5 * 2  # five steps of the two layers, every one row by row


def test_attention_summaries_are_the_same_from_both_decoders():
    model = fake_model()
    native, reference = Run(model, "native"), Run(model, "transformers")
    summaries = {"native": [], "transformers": []}
    for run in (native, reference):
        run.step([("a", list(range(30, 50))), ("b", [1, 2, 3])], inspect={"a"})
        summaries[run.forward.decoder.name] += (
            run.forward.take_attention().values()
        )  # taken each step, as the engine does
        run.step([("a", [7]), ("b", [8])])
        summaries[run.forward.decoder.name] += run.forward.take_attention().values()
    assert [s["positions"] for s in summaries["native"]] == [20, 21]  # a's prompt, then its decode token
    assert summaries["native"] == summaries["transformers"]  # the same queries and keys reach the probe


def test_auto_picks_native_for_the_llama_family_and_transformers_for_the_rest():
    for model in (fake_model(), tiny("qwen2"), tiny("qwen3")):
        pool = PagedKVPool(model, None, num_blocks=4, block_size=BLOCK, max_batch_tokens=64)
        decoder = decoder_for(model, pool, "auto")
        assert decoder.name == "native"
        assert decoder_report(decoder, model, "auto")["reason"].startswith("the native step")
    other = tiny("gpt2")
    assert "architecture (gpt2)" in native_support(other)


def test_the_decoder_choice_is_checked_by_name():
    model = fake_model()
    pool = PagedKVPool(model, None, num_blocks=4, block_size=BLOCK, max_batch_tokens=64)
    with pytest.raises(UserError, match="--decoder must be one of auto, native, transformers, got 'fast'") as bad:
        decoder_for(model, pool, "fast")
    assert bad.value.field == "decoder"
    for layer in model.base.model.layers:  # a Llama whose MLP the native step does not run
        layer.mlp.act_fn = torch.nn.GELU()
    with pytest.raises(UserError, match="--decoder native cannot run this model: its MLP's activation is GELU"):
        decoder_for(model, pool, "native")
    assert decoder_for(model, pool, "auto").name == "transformers"
    report = decoder_report(decoder_for(model, pool, "auto"), model, "auto")
    assert report == {
        "name": "transformers",
        "asked": "auto",
        "reason": "transformers' forward: the native step does not run this model (its MLP's activation is "
        "GELU, not SiLU)",
    }


@pytest.mark.parametrize("decoder", ["native", "transformers"])
def test_an_engine_on_either_decoder_reports_it_and_serves_a_request_with_its_kv_checked(decoder):
    loaded = loader.load("fake", "cpu", "auto")
    engine = Engine(EngineConfig(model="fake", decoder=decoder), loaded=loaded).start()
    try:
        assert engine.decoder()["name"] == decoder and engine.snapshot()["decoder"]["asked"] == decoder
        events = [e.to_dict() for e in engine.submit(ask("Tell me", max_new_tokens=12), "r")]
    finally:
        engine.shutdown()
    tokens = [e for e in events if e["type"] == "token"]
    assert events[-1]["type"] == "finished" and len(tokens) == 12
    assert [t["cache_tokens"] for t in tokens] == list(range(tokens[0]["cache_tokens"], tokens[0]["cache_tokens"] + 12))
    assert engine.pool.writes.failed == 0 and engine.pool.writes.checked > 0


def test_api_model_says_which_decoder_runs_and_serve_takes_the_flag(shared_engine):
    from app import create_app
    from kvscope.cli import build_parser

    client = create_app({"TESTING": True, "ENGINE": shared_engine("fake")}).test_client()
    decoder = client.get("/api/model").json["decoder"]
    assert decoder == {
        "name": "native",
        "asked": "auto",
        "reason": "the native step: llama is a Llama-family architecture",
    }
    assert client.get("/api/engine").json["decoder"] == decoder
    assert build_parser().parse_args(["serve", "--decoder", "transformers"]).decoder == "transformers"
    assert build_parser().parse_args(["serve"]).decoder == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--decoder", "fast"])


def test_a_remote_engine_names_no_decoder_of_ours():
    from app.engine_ext import decoder

    class Remote:
        local = None  # a remote engine's server runs the model (model_runner/remote/)

    assert decoder(Remote()) == {"name": None, "asked": None, "reason": "a remote engine: its server runs the model"}


def test_serve_refuses_a_decoder_for_a_remote_engine(capsys):
    from kvscope.cli import main

    assert main(["serve", "--engine", "openai:http://127.0.0.1:9", "--decoder", "native"]) == 2
    assert "--decoder chooses the built-in engine's decoder, not --engine's" in capsys.readouterr().err


@pytest.mark.parametrize("decoder", ["native", "transformers"])
def test_chunked_prefill_prefix_caching_and_preemption_serve_the_script_on_either_decoder(engine_factory, decoder):
    # Six requests sharing a long system prompt in a pool too small for all of them at once: prefixes shared,
    # prompts chunked beside decodes, some requests preempted and replayed, on each decoder.
    from kvscope_testkit import blocks_mb, events_of

    from model_runner.loading.fake import ANSWER
    from model_runner.shared.policy import Policy

    policy = Policy(max_num_seqs=6, chunked_prefill=True, chunk_size=16, prefix_caching=True)
    engine = engine_factory("fake", decoder=decoder, kv_cache_mb=blocks_mb(24), policy=policy)
    system = "You answer questions about caches, briefly and kindly. " * 2
    first = engine.submit(ask("question 0", system=system, max_new_tokens=60), "r0")
    while first.next_event(30).type != "token":  # its prompt's blocks are cached once it has prefilled
        pass
    others = [engine.submit(ask(f"question {i}", system=system, max_new_tokens=60), f"r{i}") for i in range(1, 6)]
    ends = [events_of(first)[-1]] + [events_of(h)[-1] for h in others]
    assert [e["type"] for e in ends] == ["finished"] * 6
    assert all(e["text"] == ANSWER[:60] for e in ends)
    assert engine.preemptions > 0 and engine.prefix_hit_tokens > 0
    assert engine.pool.writes.failed == 0 and engine.decoder()["name"] == decoder
