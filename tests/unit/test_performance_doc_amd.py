"""docs/performance.md's section on the AMD EPYC, "float32 on oneDNN's packed weights": every figure it quotes
is recomputed here from the profiles and bench runs kept in docs/bench/ and must appear as written, and what the
section says of them (faster after, one machine, the targets missed by what it says) holds in the files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from test_performance_doc import vllm_figures

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
BENCH = ROOT / "docs/bench"
ROUTES = {"float32": "float32", "default route": "int4"}  # the table's route → the files' name part
CASES = [("float32", "AVX-512"), ("float32", "AVX2"), ("default route", "AVX-512")]

pytestmark = pytest.mark.unit


def bench_file(name: str) -> dict:
    return json.loads((BENCH / name).read_text(encoding="utf-8"))


def profile_name(route: str, kernels: str, when: str) -> str:
    return f"profile-amd-{ROUTES[route]}-{kernels.lower().replace('-', '')}-{when}.json"


def profile(route: str, kernels: str, when: str) -> dict:
    return bench_file(profile_name(route, kernels, when))


def self_ms(run: dict, op: str) -> float:
    return next(o["self_ms_per_step"] for o in run["profile"]["ops"] if o["op"] == op)


def median_step(run: dict) -> float:
    return statistics.median(run["median_step_ms_per_repeat"])


def change(after: float, before: float) -> str:
    return f"{(after / before - 1) * 100:+.0f} %".replace("-", "−")


MM, PACKED, INT4 = "aten::mm", "mkldnn::_linear_pointwise", "aten::_weight_int4pack_mm_for_cpu"


def amd_figures() -> dict[str, str]:
    """The section's figures, worked out from the kept files, as the page writes them."""
    rows = []
    for route, kernels in CASES:
        for when in ("before", "after"):
            run = profile(route, kernels, when)
            steps = ", ".join(f"{t:.2f}" for t in run["median_step_ms_per_repeat"])
            rows.append(
                f"| {route} | {kernels} ({run['capability']}) | {when} | {steps} ms | "
                f"{run['profile']['aten_calls_per_step']:,} | `{profile_name(route, kernels, when)}` |"
            )
    f32 = {w: profile("float32", "AVX-512", w) for w in ("before", "after")}
    avx2 = {w: profile("float32", "AVX2", w) for w in ("before", "after")}
    int4 = {w: profile("default route", "AVX-512", w) for w in ("before", "after")}
    a, v = bench_file("amd-lone-decode-llamacpp.json"), bench_file("amd-lone-decode-vllm.json")
    native, llama = a["routes"]["auto:native"]["lone_decode_tokens_per_s"], a["anchor"]["lone_decode_tokens_per_s"]
    typical, later_typical = (run["anchor"]["typical_token_ms"]["median"] for run in (a, v))
    return {
        **vllm_figures("amd-lone-decode-vllm.json"),
        "flags": ", ".join(f32["after"]["cpu_flags"]),
        "amd_rows": "\n".join(rows),
        "mm_before": f"{self_ms(f32['before'], MM):.2f}",
        "mm_after": f"{self_ms(f32['after'], PACKED):.2f}",
        "head_after": f"{self_ms(f32['after'], MM):.2f}",
        "f32_before": f"{median_step(f32['before']):.2f}",
        "f32_after": f"{median_step(f32['after']):.2f}",
        "f32_change": change(median_step(f32["after"]), median_step(f32["before"])),
        "avx2_before": f"{median_step(avx2['before']):.2f}",
        "avx2_after": f"{median_step(avx2['after']):.2f}",
        "avx2_change": change(median_step(avx2["after"]), median_step(avx2["before"])),
        "avx2_lo": f"{min(avx2['after']['median_step_ms_per_repeat']):.2f}",
        "avx2_hi": f"{max(avx2['after']['median_step_ms_per_repeat']):.2f}",
        "int4_before": f"{self_ms(int4['before'], INT4):.2f}",
        "int4_after": f"{self_ms(int4['after'], INT4):.2f}",
        "prompt_before": f"{self_ms(int4['before'], MM) * 32:.0f}",
        "prompt_after": f"{self_ms(int4['after'], PACKED) * 32:.0f}",
        "a_command": a["command"],
        "a_started": a["started_at"][:16].replace("T", " ") + " UTC",
        "a_load_start": f"{a['machine']['load_average_start'][0]}",
        "a_load_end": f"{a['machine']['load_average_end'][0]}",
        "a_native": f"{native['median']:.1f}",
        "a_native_lo": f"{native['min']:.1f}",
        "a_native_hi": f"{native['max']:.1f}",
        "a_n": f"{native['n']}",
        "a_f32": f"{a['routes']['float32']['lone_decode_tokens_per_s']['median']:.1f}",
        "a_batched": f"{a['routes']['auto:native']['batched_tokens_per_s']['median']:.1f}",
        "a_llama": f"{llama['median']:.1f}",
        "a_llama_lo": f"{llama['min']:.1f}",
        "a_llama_hi": f"{llama['max']:.1f}",
        "a_llama_typical": f"{typical:.2f}",
        "a_typical": f"{a['routes']['auto:native']['typical_token_ms']['median']:.2f}",
        "a_stall": f"{(1 - llama['median'] / (1000 / typical)) * 100:.0f} %",
        "a_ratio": f"{a['ratios']['lone_auto:native_over_llamacpp']['value']:.2f}×",
        "a_typical_ratio": f"{typical / a['routes']['auto:native']['typical_token_ms']['median']:.2f}×",
        "v_typical": f"{v['vllm_anchor']['typical_token_ms']['median']:.2f}",
        "f_typical": f"{v['routes']['float32']['typical_token_ms']['median']:.2f}",
        "v_short": f"{(1 / v['ratios']['lone_float32_over_vllm']['value'] - 1) * 100:.1f} %",
        "b_ratio": f"{v['ratios']['lone_auto:native_over_llamacpp']['value']:.2f}×",
        "b_typical_ratio": f"{later_typical / v['routes']['auto:native']['typical_token_ms']['median']:.2f}×",
        "b_stall": f"{(1 - v['anchor']['lone_decode_tokens_per_s']['median'] / (1000 / later_typical)) * 100:.0f} %",
        "b_native": f"{v['routes']['auto:native']['lone_decode_tokens_per_s']['median']:.1f}",
    }


SECTION_START = "## float32 on oneDNN's packed weights: an AMD EPYC"
SECTION = DOC[DOC.index(SECTION_START) : DOC.index("## The float32 route's siblings in one call")]
TEMPLATE = (Path(__file__).with_name("performance_amd_section.md")).read_text(encoding="utf-8")


def test_the_section_is_its_template_filled_from_the_kept_files():
    """Every figure of the section at once: the page's text is the template with the files' figures."""
    assert SECTION == TEMPLATE.format(**amd_figures())


def test_what_the_section_says_of_its_figures_holds_in_the_files():
    for route, kernels in CASES:
        before, after = profile(route, kernels, "before"), profile(route, kernels, "after")
        assert median_step(after) < median_step(before)  # faster after, on every kernel path
        for run in (before, after):
            assert run["cpu"] == "AMD EPYC" and run["threads"] == 2
            assert run["cpu_flags"] == profile("float32", "AVX-512", "after")["cpu_flags"]  # one machine
            assert run["capability"] == ("AVX512" if kernels == "AVX-512" else "AVX2")
            assert 0.5 < run["load_average"][0] < 1.5  # "load near 1"
    assert not [f for f in profile("float32", "AVX-512", "after")["cpu_flags"] if f.startswith("amx")]  # "no AMX"
    assert 44 < min(profile("float32", "AVX-512", "before")["median_step_ms_per_repeat"])  # "a 44–50 ms step"
    assert max(profile("float32", "AVX-512", "before")["median_step_ms_per_repeat"]) < 50
    int4 = profile("default route", "AVX-512", "after")
    assert abs(self_ms(int4, INT4) - self_ms(profile("default route", "AVX-512", "before"), INT4)) < 0.05  # untouched
    a, v = bench_file("amd-lone-decode-llamacpp.json"), bench_file("amd-lone-decode-vllm.json")
    lone, typical = (a["ratios"][f"{k}_auto:native_over_llamacpp"]["value"] for k in ("lone", "typical"))
    assert lone > 1.2 > 1 > typical  # "over the 1.2× target in this run" by tokens/s; a typical token under 1
    assert a["ratios"]["typical_auto:native_over_llamacpp"]["target"] is None  # "which the target does not cover"
    later, later_typical = (v["ratios"][f"{k}_auto:native_over_llamacpp"]["value"] for k in ("lone", "typical"))
    assert later < 1.2 < lone and abs(later_typical - typical) < 0.05  # "not in the next", "the second held"
    vllm = v["ratios"]["lone_float32_over_vllm"]
    assert vllm["value"] < 1.0 and vllm["target"] is None  # vLLM faster; "the bench sets no target"
    assert v["vllm_anchor"]["threads"] == 1 and v["machine"]["torch_threads"] == 2  # "on twice its cores"
    assert v["started_at"] > a["started_at"] and v["command"] == a["command"]  # "right after it, the same command"
    flags = profile("float32", "AVX-512", "after")["cpu_flags"]
    for run in (a, v):
        assert "oneDNN" in run["routes"]["float32"]["facts"]["dtype_reason"]  # both runs on the packed weights
        assert run["machine"]["cpu"] == "AMD EPYC" and run["machine"]["cpu_flags"] == flags  # the profiles' CPU
