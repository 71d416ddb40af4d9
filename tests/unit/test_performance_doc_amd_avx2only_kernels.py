"""docs/performance.md's section "The default route on the AVX2-only EPYC: other kernels, compiled stretches,
8 clients": every figure it quotes is recomputed here from the weight-kernel runs, the compile probe and the
8-client runs kept in docs/bench/ and must appear as written, and what the section says of them (no faster
weight-only kernel, every compiled variant slower with eager's bits, the target missed by every pair, the
machine speeding up) holds in the files."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from test_performance_doc import bench_file

from bench.weight_kernels import SMOLLM2_CALLS, SMOLLM2_LAYERS

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
ONE, EIGHT = "amd-avx2only-weight-kernels-1-row.json", "amd-avx2only-weight-kernels-8-rows.json"
PROBE, PAIRS = "amd-avx2only-compile-probe.json", "amd-avx2only-8-clients-before-after.json"
PROFILE_8 = "profile-amd-avx2only-int4-8-clients.json"
INT4, HEAD = "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm"
SDPA, GATHER = "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index_select"
ANCHOR_RUN = "amd-avx2only-lone-decode-vllm.json"
TARGET_8, TARGET_LONE = 1.3, 1.2  # the targets: 8 clients over the old native step; lone over llama.cpp

pytestmark = pytest.mark.unit


def kernels(name: str) -> dict[str, dict]:
    return {row["kernel"]: row for row in bench_file(name)["kernels"]}


def x(value: float) -> str:
    return f"{value:.2f}"


def aggregate(run: dict, route: str) -> float:
    return run["run"]["routes"][route]["batched_tokens_per_s"]["median"]


def pairs() -> list[tuple[dict, dict]]:
    """(before, after) runs of each pair, as the file holds them."""
    runs = bench_file(PAIRS)["runs"]
    return [tuple(next(r for r in runs if r["pair"] == p and r["step"] == s) for s in ("before", "after")) for p in (1, 2, 3, 4)]  # fmt: skip


def pair_ratios(route: str) -> list[float]:
    return [aggregate(after, route) / aggregate(before, route) for before, after in pairs()]


def native_lead(step: str) -> float:
    runs = [r for r in bench_file(PAIRS)["runs"] if r["step"] == step]
    return statistics.median(aggregate(r, "auto:native") / aggregate(r, "auto:transformers") for r in runs)


def wins(kernel: dict, other: dict) -> int:
    """In how many interleaved rounds `kernel` took less time than `other`."""
    return sum(a < b for a, b in zip(kernel["ms_per_round"], other["ms_per_round"]))


def slower_rounds(variant: dict, eager: dict) -> int:
    return sum(a > b for a, b in zip(variant["forward_ms_per_round"], eager["forward_ms_per_round"]))


def bits(row: dict) -> str:
    found = set(row["stretches_vs_eager"].values())
    return "both: eager's" if found == {"same bits"} else "differ"


def profile_op(run: dict, name: str) -> dict:
    return next(o for o in run["profile"]["ops"] if o["op"] == name)


def pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def profile_figures() -> dict[str, str]:
    run, eight = bench_file(PROFILE_8), kernels(EIGHT)
    kernel, head, sdpa, gather = (profile_op(run, name) for name in (INT4, HEAD, SDPA, GATHER))
    profile, medians = run["profile"], run["median_step_ms_per_repeat"]
    return {
        "p8_slow": f"{(medians[2] / statistics.median(medians[:2]) - 1) * 100:.0f}",
        "p8_profiled": f"{profile['profiled_step_ms']:.2f}",
        "p8_self": f"{kernel['self_ms_per_step'] / kernel['share']:.0f}",
        "p8_mean": f"{profile['profiled_wall_ms'] / profile['profiled_decode_steps']:.0f}",
        "p8_gather_calls": f"{gather['calls_per_step']:.0f}",
        "p8_weights_share": pct(kernel["share"] + head["share"]),
        "int8_8_wins": f"{wins(eight['int8'], eight['int4'])}",
        "int4_8": f"{eight['int4']['ms_per_step']:.2f}",
        "int4_8_min": f"{min(eight['int4']['ms_per_round']):.2f}",
        "int4_8_max": f"{max(eight['int4']['ms_per_round']):.2f}",
        "p8_steps": f"{run['profile']['profiled_decode_steps']}",
        "p8_medians": ", ".join(f"{t:.2f}" for t in run["median_step_ms_per_repeat"]),
        "p8_calls": f"{run['profile']['aten_calls_per_step']:,}",
        "p8_int4": f"{kernel['self_ms_per_step']:.2f}",
        "p8_int4_share": pct(kernel["share"]),
        "p8_int4_each": f"{kernel['self_ms_per_step'] / kernel['calls_per_step'] * 1000:.0f}",
        "p8_head": f"{head['self_ms_per_step']:.2f}",
        "p8_head_share": pct(head["share"]),
        "p8_sdpa": f"{sdpa['self_ms_per_step']:.2f}",
        "p8_gather": f"{gather['self_ms_per_step']:.2f}",
        "p8_attn_share": pct(sdpa["share"] + gather["share"]),
    }


def probe_row(v: dict) -> str:
    if v["variant"] == "eager":
        return f"| eager | {v['forward_ms']:.2f} ms | 1.000 | — | — | — | — |"
    answer = "eager's" if v["same_answer_as_eager"] else "differs"
    warm = f"{v['warm_s']:.1f} s"
    return f"| {v['variant']} | {v['forward_ms']:.2f} ms | {v['vs_eager']:.3f} | {warm} | {v['graphs']} | {bits(v)} | {answer} |"


def figures() -> dict[str, str]:
    """The section's figures, worked out from the kept files, as the page writes them."""
    one, eight, run = kernels(ONE), kernels(EIGHT), bench_file(ONE)
    int4 = one["int4"]
    rows = [
        f"| {name} | {one[name]['ms_per_step']:.2f} ms | {x(one[name]['vs_int4'])} | {eight[name]['ms_per_step']:.2f} ms"
        f" | {x(eight[name]['vs_int4'])} | {one[name]['weight_bytes'] / 1e6:.1f} MB |"
        for name in one
    ]
    variants = bench_file(PROBE)["variants"]
    compiled = variants[1:]  # eager first
    probe_rows = [probe_row(v) for v in variants]
    l_typical = bench_file(ANCHOR_RUN)["anchor"]["typical_token_ms"]["median"]
    ratios = pair_ratios("auto:native")
    pair_rows = [
        f"| {i} | {aggregate(before, 'auto:native'):.1f} | {aggregate(after, 'auto:native'):.1f} | {x(r)}× |"
        for i, ((before, after), r) in enumerate(zip(pairs(), ratios), start=1)
    ]
    median = statistics.median(ratios)
    return {
        "flags": ", ".join(run["cpu_flags"]),
        "capability": run["capability"],
        "calls": f"{len(run['calls_per_layer']) * run['layers']}",
        "rounds": f"{len(int4['ms_per_round'])}",
        "kernel_rows": "\n".join(rows),
        "int4_1": f"{int4['ms_per_step']:.2f}",
        "int4_1_min": f"{min(int4['ms_per_round']):.2f}",
        "int4_1_max": f"{max(int4['ms_per_round']):.2f}",
        "allowed": f"{l_typical / TARGET_LONE:.2f}",
        "l_typical": f"{l_typical:.2f}",
        **{
            f"{key}_1": x(one[name]["vs_int4"])
            for key, name in (
                ("f16", "float16"),
                ("int8", "int8"),
                ("bf16", "bfloat16"),
                ("f32", "float32"),
                ("dyn", "dynamic int8"),
            )
        },  # fmt: skip
        "dyn_1_min": f"{min(one['dynamic int8']['ms_per_round']):.2f}",
        "dyn_1_max": f"{max(one['dynamic int8']['ms_per_round']):.2f}",
        "dyn_8": x(eight["dynamic int8"]["vs_int4"]),
        "int8_8": x(eight["int8"]["vs_int4"]),
        "dyn_1_wins": f"{wins(one['dynamic int8'], one['int4'])}",
        "dyn_8_wins": f"{wins(eight['dynamic int8'], eight['int4'])}",
        "int4_growth": f"{eight['int4']['ms_per_step'] / int4['ms_per_step']:.1f}",
        "dyn_growth": f"{eight['dynamic int8']['ms_per_step'] / one['dynamic int8']['ms_per_step']:.1f}",
        "probe_rounds": f"{len(variants[0]['forward_ms_per_round'])}",
        "probe_time": bench_file(PROBE)["started_at"][11:16],
        "probe_rows": "\n".join(probe_rows),
        "slowest_pct": f"{(max(v['vs_eager'] for v in compiled) - 1) * 100:.1f}",
        "fastest_pct": f"{(min(v['vs_eager'] for v in compiled) - 1) * 100:.1f}",
        "slower_rounds": ", ".join(str(slower_rounds(v, variants[0])) for v in compiled[:-1])
        + f" and {slower_rounds(compiled[-1], variants[0])}",
        "pair_rows": "\n".join(pair_rows),
        "pair_median": x(median),
        "pair_short": f"{(1 - median / TARGET_8) * 100:.1f}",
        "pair_lo": x(min(ratios)),
        "pair_hi": x(max(ratios)),
        "tf_pair_median": x(statistics.median(pair_ratios("auto:transformers"))),
        "nt_before": x(native_lead("before")),
        "nt_after": x(native_lead("after")),
        **profile_figures(),
    }


SECTION_START = "## The default route on the AVX2-only EPYC: other kernels, compiled stretches, 8 clients"
SECTION = DOC[DOC.index(SECTION_START) : DOC.index("## The decode stretches compiled ahead of time")]
TEMPLATE = (Path(__file__).with_name("performance_amd_avx2only_kernels_section.md")).read_text(encoding="utf-8")


def test_the_section_is_its_template_filled_from_the_kept_files():
    assert SECTION == TEMPLATE.format(**figures()) + "\n"


def test_the_runs_are_one_machine_at_two_threads_and_the_model_s_own_calls():
    anchor = bench_file(ANCHOR_RUN)["machine"]
    files = [bench_file(name) for name in (ONE, EIGHT, PROBE)]
    for run in files:
        assert (run["cpu"], run["capability"], run["threads"]) == ("AMD EPYC", "AVX2", 2)
        assert run["cpu_flags"] == anchor["cpu_flags"] and not [f for f in run["cpu_flags"] if "avx512" in f]
    for run in files[:2]:
        assert run["calls_per_layer"] == [list(c) for c in SMOLLM2_CALLS] and run["layers"] == SMOLLM2_LAYERS
    assert (files[0]["rows"], files[1]["rows"]) == (1, 8)
    for before, after in pairs():
        assert before["commit"] == "692ab14" and after["commit"] in ("b53eafb", "f15c2cb")
        assert after["run"]["machine"]["cpu_flags"] == anchor["cpu_flags"]  # 692ab14's bench did not record flags
        for side in (before, after):
            machine = side["run"]["machine"]
            assert machine["platform"] == anchor["platform"] and machine["torch_threads"] == 2
            assert "--concurrency 8" in side["run"]["command"] and "--repeats 3" in side["run"]["command"]


def test_what_the_section_says_of_its_figures_holds_in_the_files():
    one, eight = kernels(ONE), kernels(EIGHT)
    weight_only = [name for name in one if name not in ("int4", "dynamic int8")]
    assert all(one[name]["vs_int4"] > 1 for name in weight_only)  # "no other weight-only kernel is faster"
    l_typical = bench_file(ANCHOR_RUN)["anchor"]["typical_token_ms"]["median"]
    assert min(one["int4"]["ms_per_round"]) > l_typical / TARGET_LONE  # "even its fastest round is over"
    assert one["int4"]["ms_per_step"] > l_typical  # "the calls alone" take more than llama.cpp's token
    dyn = one["dynamic int8"]["ms_per_round"]
    assert min(one["int4"]["ms_per_round"]) < max(dyn)  # "the rounds overlap"
    assert max(eight["dynamic int8"]["ms_per_round"]) < min(eight["int4"]["ms_per_round"])  # clear at 8 rows
    variants = bench_file(PROBE)["variants"]
    for v in variants[1:]:
        assert v["vs_eager"] > 1 and v["graphs"] == 2 and v["same_answer_as_eager"]  # slower, eager's bits and answer
        assert set(v["stretches_vs_eager"].values()) == {"same bits"}
    ratios = pair_ratios("auto:native")
    assert all(r < TARGET_8 for r in ratios)  # "every pair's ratio falls below it"
    befores = [aggregate(b, "auto:native") for b, _ in pairs()]
    afters = [aggregate(a, "auto:native") for _, a in pairs()]
    assert befores == sorted(befores) and afters == sorted(afters)  # "both sides' figures rise pair by pair"
    assert native_lead("after") <= native_lead("before")  # "the native step's lead did not grow"
    profile = bench_file(PROFILE_8)
    assert (profile["clients"], profile["route"], profile["profile"]["profiled_other_steps"]) == (8, "auto:native", 0)
    assert profile["profile"]["ops"][0]["op"] == INT4  # "the weight kernels are the largest part"
    assert profile_op(profile, INT4)["calls_per_step"] == 120
    medians = profile["median_step_ms_per_repeat"]
    assert medians[2] > max(medians[:2])  # "the third slower than the other two"
    assert profile["profile"]["ops"][1]["op"] == HEAD  # the two weight kernels lead the profile
    assert profile["cpu_flags"] == bench_file(ONE)["cpu_flags"] and profile["threads"] == 2
    order = [(r["pair"], r["step"]) for r in bench_file(PAIRS)["runs"]]
    assert order.index((1, "before")) < order.index((1, "after")) and order.index((3, "after")) < order.index((3, "before"))  # fmt: skip
