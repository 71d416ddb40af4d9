"""docs/performance.md's section "Eight clients against the step the issue started from, and prompts attended apart:
an Intel Xeon": the section is its template filled with figures recomputed here from the pairs, profile and
weight-kernel files kept in docs/bench/, and what its sentences say of them (the target missed in both kernel
sets, the prompts' attention apart faster in every pair, the decode step's budget) holds in the files."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from test_performance_doc import bench_file

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
PAIRS, APART = "intel-8-clients-before-after.json", "intel-prompts-apart.json"
PROFILE = "profile-intel-int4-8-clients-compiled.json"
KERNELS = {1: "intel-weight-kernels-1-row.json", 8: "intel-weight-kernels-8-rows.json"}
TRANSFORMERS, EAGER, COMPILED = "auto:transformers", "auto:native", "auto:native:compiled"
INT4, HEAD = "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm"
GATHER, SDPA, TOPK = "aten::index_select", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::topk"
TARGET = 1.3  # the issue's: 8 clients' aggregate tokens/s over the native step it started from
TOKENS, CLIENTS = 32, 8

pytestmark = pytest.mark.unit


def x(value: float) -> str:
    return f"{value:.2f}"


def agg(run: dict, route: str) -> float:
    return run["routes"][route]["batched_tokens_per_s"]["median"]


def pairs(kernels: str) -> list[tuple[dict, dict]]:
    """(before, after) runs of each pair on these kernels, in pair order."""
    runs = [r for r in bench_file(PAIRS)["runs"] if r["kernels"] == kernels]
    by_pair: dict[int, dict] = {}
    for r in runs:
        by_pair.setdefault(r["pair"], {})[r["step"]] = r["run"]
    return [(p["before"], p["after"]) for _, p in sorted(by_pair.items())]


def ratios(kernels: str, after_route: str, before_route: str = EAGER) -> list[float]:
    return [agg(after, after_route) / agg(before, before_route) for before, after in pairs(kernels)]


def pair_rows(kernels: str) -> list[str]:
    return [
        f"| {kernels} | {i} | {agg(b, EAGER):.1f} | {agg(a, EAGER):.1f} | {agg(a, COMPILED):.1f} | "
        f"{agg(a, COMPILED) / agg(b, EAGER):.2f}× | {agg(b, TRANSFORMERS):.1f} → {agg(a, TRANSFORMERS):.1f} |"
        for i, (b, a) in enumerate(pairs(kernels), start=1)
    ]


def op(profile: dict, name: str) -> dict:
    return next(o for o in profile["profile"]["ops"] if o["op"] == name)


def kernel_ms(rows: int, name: str) -> float:
    return next(k["ms_per_step"] for k in bench_file(KERNELS[rows])["kernels"] if k["kernel"] == name)


def apart_pairs() -> list[tuple[dict, dict]]:
    by_pair: dict[int, dict] = {}
    for r in bench_file(APART)["runs"]:
        by_pair.setdefault(r["pair"], {})[r["step"]] = r["run"]
    return [(p["packed"], p["apart"]) for _, p in sorted(by_pair.items())]


def budget() -> dict[str, float]:
    """What 1.3× would ask of the compiled step natively: the before runs' median aggregate × 1.3 sets the wall
    time of 8 × 32 tokens; the prompts' one step (8 × 64 tokens, from the output-lens-2 runs) and 31 decode
    steps share it."""
    before = statistics.median(agg(b, EAGER) for b, _ in pairs("AVX-512"))
    wall_s = CLIENTS * TOKENS / (TARGET * before)
    profile = bench_file(PROFILE)
    step_ms = statistics.median(profile["median_step_ms_per_repeat"])
    return {"before": before, "wall_s": wall_s, "step_ms": step_ms, "decode_s": (TOKENS - 1) * step_ms / 1000}


def figures() -> dict[str, str]:
    first = bench_file(PAIRS)["runs"][0]["run"]
    profile, b = bench_file(PROFILE), budget()
    n_c, a_c = ratios("AVX-512", COMPILED), ratios("AVX2 forced", COMPILED)
    apart = apart_pairs()
    return {
        "cpu": first["machine"]["cpu"],
        "torch": first["machine"]["torch"],
        "before_command": first["command"],
        "after_command": next(r["run"]["command"] for r in bench_file(PAIRS)["runs"] if r["step"] == "after"),
        "pair_rows": "\n".join(pair_rows("AVX-512") + pair_rows("AVX2 forced")),
        "n_c": x(statistics.median(n_c)),
        "a_c": x(statistics.median(a_c)),
        "n_c_lo": x(min(n_c)),
        "n_c_hi": x(max(n_c)),
        "a_c_lo": x(min(a_c)),
        "a_c_hi": x(max(a_c)),
        "n_miss": f"{(1 - statistics.median(n_c) / TARGET) * 100:.0f}",
        "a_miss": f"{(1 - statistics.median(a_c) / TARGET) * 100:.0f}",
        "n_e": x(statistics.median(ratios("AVX-512", EAGER))),
        "a_e": x(statistics.median(ratios("AVX2 forced", EAGER))),
        "n_t": x(statistics.median(ratios("AVX-512", TRANSFORMERS, TRANSFORMERS))),
        "a_t": x(statistics.median(ratios("AVX2 forced", TRANSFORMERS, TRANSFORMERS))),
        "p_steps": ", ".join(f"{t:.2f}" for t in profile["median_step_ms_per_repeat"]),
        "p_profiled": x(profile["profile"]["profiled_step_ms"]),
        "p_calls": f"{profile['profile']['aten_calls_per_step']:,}",
        "p_int4": x(op(profile, INT4)["self_ms_per_step"]),
        "p_int4_share": f"{op(profile, INT4)['share'] * 100:.0f}",
        "p_head": x(op(profile, HEAD)["self_ms_per_step"]),
        "p_gather": x(op(profile, GATHER)["self_ms_per_step"]),
        "p_sdpa": x(op(profile, SDPA)["self_ms_per_step"]),
        "p_topk": x(op(profile, TOPK)["self_ms_per_step"]),
        "k1": x(kernel_ms(1, "int4")),
        "k8": x(kernel_ms(8, "int4")),
        "k_ratio": x(kernel_ms(8, "int4") / kernel_ms(1, "int4")),
        "k8_int8": x(kernel_ms(8, "int8") / kernel_ms(8, "int4")),
        "k8_f32": x(kernel_ms(8, "float32") / kernel_ms(8, "int4")),
        "k8_bf16": x(kernel_ms(8, "bfloat16") / kernel_ms(8, "int4")),
        "k8_dyn": x(kernel_ms(8, "dynamic int8") / kernel_ms(8, "int4")),
        "b_before": f"{b['before']:.1f}",
        "b_target": f"{b['before'] * TARGET:.1f}",
        "b_wall": x(b["wall_s"]),
        "b_step": x(b["step_ms"]),
        "b_decode": x(b["decode_s"]),
        "b_left": f"{(b['wall_s'] - b['decode_s']) * 1000:.0f}",
        "s_command": apart[0][0]["command"],
        "s_rows": "\n".join(
            f"| {i} | {agg(p, EAGER):.1f} | {agg(a, EAGER):.1f} | {agg(a, EAGER) / agg(p, EAGER):.2f}× |"
            for i, (p, a) in enumerate(apart, start=1)
        ),
    }


SECTION_START = "## Eight clients against the step the issue started from, and prompts attended apart: an Intel Xeon"
SECTION = DOC[DOC.index(SECTION_START) : DOC.index("## Not measured on what serves now")]
TEMPLATE = (Path(__file__).with_name("performance_intel_8_clients_section.md")).read_text(encoding="utf-8")


def test_the_section_is_its_template_filled_from_the_kept_files():
    assert SECTION == TEMPLATE.format(**figures()) + "\n"


def test_the_runs_are_one_intel_machine_at_two_threads_and_the_commits_the_section_names():
    runs = bench_file(PAIRS)["runs"] + bench_file(APART)["runs"]
    for r in runs:
        machine = r["run"]["machine"]
        assert machine["cpu"] == "Intel(R) Xeon(R) Processor" and machine["torch_threads"] == 2
        forced = r.get("kernels") == "AVX2 forced"
        assert machine["capability"] == ("AVX2" if forced else "AVX512")
    for r in bench_file(PAIRS)["runs"]:
        assert r["commit"] == {"before": "692ab14", "after": "5d462ac"}[r["step"]]
        assert (COMPILED in r["run"]["routes"]) == (r["step"] == "after")
    assert [r["commit"] for r in bench_file(APART)["runs"]] == ["80a5b3e", "5d462ac", "5d462ac", "80a5b3e"]
    for name in (PROFILE, *KERNELS.values()):
        facts = bench_file(name)
        facts = facts.get("machine", facts)
        assert facts["cpu"] == "Intel(R) Xeon(R) Processor" and facts["capability"] == "AVX512"
    assert bench_file(PROFILE)["compiled"]["state"] == "on" and bench_file(PROFILE)["clients"] == CLIENTS


def test_what_the_sentences_say_holds_in_the_files():
    for kernels in ("AVX-512", "AVX2 forced"):  # "missed in both"
        assert statistics.median(ratios(kernels, COMPILED)) < TARGET
    assert sum(r >= TARGET for r in ratios("AVX-512", COMPILED)) == 1  # "one pair of four over it"
    for packed, apart in apart_pairs():  # "faster in both pairs"
        assert agg(apart, EAGER) > agg(packed, EAGER)
    b = budget()
    assert b["decode_s"] < b["wall_s"]  # the decode steps alone fit; the prompts' step must share what is left
