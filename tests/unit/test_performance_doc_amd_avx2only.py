"""docs/performance.md's section on the AVX2-only AMD EPYC, "The float32 route's siblings in one call": every
figure it quotes is recomputed here from the profiles and the bench run kept in docs/bench/ and must appear as
written, and what the section says of them (faster after, 120 calls instead of 210, one machine without
AVX-512, the targets met and missed as it says) holds in the files."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_performance_doc import bench_file, vllm_figures
from test_performance_doc_amd import change, median_step

from model_runner.loading.packed import PROBE_ROWS

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
RUN = "amd-avx2only-lone-decode-vllm.json"
PACKED, INT4 = "mkldnn::_linear_pointwise", "aten::_weight_int4pack_mm_for_cpu"
HEAD, SDPA = "aten::_weight_int8pack_mm", "aten::_scaled_dot_product_flash_attention_for_cpu"

pytestmark = pytest.mark.unit


def profile_name(when: str) -> str:
    return f"profile-amd-avx2only-float32-{when}.json"


def op(run: dict, name: str) -> dict:
    return next(o for o in run["profile"]["ops"] if o["op"] == name)


def steps(run: dict) -> str:
    return ", ".join(f"{t:.2f}" for t in run["median_step_ms_per_repeat"])


def figures() -> dict[str, str]:
    """The section's figures, worked out from the kept files, as the page writes them."""
    f32 = {when: bench_file(profile_name(when)) for when in ("before", "after")}
    rows = [
        f"| {when} | {steps(run)} ms | {run['profile']['aten_calls_per_step']:,} | "
        f"{op(run, PACKED)['calls_per_step']:.0f} | {op(run, PACKED)['self_ms_per_step']:.2f} ms | "
        f"{run['load_average'][0]:.2f} | `{profile_name(when)}` |"
        for when, run in f32.items()
    ]
    run, earlier = bench_file(RUN), bench_file("amd-lone-decode-vllm.json")
    routes, llama, ratios = run["routes"], run["anchor"], run["ratios"]
    native, float32 = routes["auto:native"], routes["float32"]
    int4 = bench_file("profile-amd-avx2only-int4.json")
    kernel, sdpa = op(int4, INT4), op(int4, SDPA)
    lone = lambda r: r["lone_decode_tokens_per_s"]["median"]  # noqa: E731
    return {
        **vllm_figures(RUN),
        "flags": ", ".join(f32["after"]["cpu_flags"]),
        "capability": f32["after"]["capability"],
        "rows": "\n".join(rows),
        "f32_before": f"{median_step(f32['before']):.2f}",
        "f32_after": f"{median_step(f32['after']):.2f}",
        "f32_change": change(median_step(f32["after"]), median_step(f32["before"])),
        "mm_before": f"{op(f32['before'], PACKED)['self_ms_per_step']:.2f}",
        "mm_after": f"{op(f32['after'], PACKED)['self_ms_per_step']:.2f}",
        "p_before": f"{f32['before']['profile']['profiled_step_ms']:.2f}",
        "p_after": f"{f32['after']['profile']['profiled_step_ms']:.2f}",
        "f_lo": f"{float32['lone_decode_tokens_per_s']['min']:.1f}",
        "f_hi": f"{float32['lone_decode_tokens_per_s']['max']:.1f}",
        "slow_repeat": f"{max(f32['before']['median_step_ms_per_repeat']):.2f}",
        "n": f"{native['lone_decode_tokens_per_s']['n']}",
        "f_typical": f"{float32['typical_token_ms']['median']:.2f}",
        "d_lone": f"{lone(native):.1f}",
        "d_typical": f"{native['typical_token_ms']['median']:.2f}",
        "l_lone": f"{lone(llama):.1f}",
        "l_typical": f"{llama['typical_token_ms']['median']:.2f}",
        "v_typical": f"{run['vllm_anchor']['typical_token_ms']['median']:.2f}",
        "avx512_vllm": f"{lone(earlier['vllm_anchor']):.1f}",
        "avx512_f32": f"{lone(earlier['routes']['float32']):.1f}",
        "v_fraction": f"{lone(run['vllm_anchor']) / lone(earlier['vllm_anchor']) * 100:.0f} %",
        "f_fraction": f"{lone(float32) / lone(earlier['routes']['float32']) * 100:.0f} %",
        "l_ratio": f"{ratios['lone_auto:native_over_llamacpp']['value']:.2f}×",
        "l_typical_ratio": f"{ratios['typical_auto:native_over_llamacpp']['value']:.2f}×",
        "l_short": f"{(1 - ratios['lone_auto:native_over_llamacpp']['value'] / 1.2) * 100:.0f} %",
        "i_steps": steps(int4),
        "i_calls": int4["profile"]["aten_calls_per_step"],
        "i_int4": f"{kernel['self_ms_per_step']:.2f}",
        "i_int4_calls": f"{kernel['calls_per_step']:.0f}",
        "i_int4_each": f"{kernel['self_ms_per_step'] / kernel['calls_per_step'] * 1000:.0f}",
        "i_head": f"{op(int4, HEAD)['self_ms_per_step']:.2f}",
        "i_sdpa": f"{sdpa['self_ms_per_step']:.2f}",
        "i_sdpa_calls": f"{sdpa['calls_per_step']:.0f}",
        "i_prompt": f"{op(int4, PACKED)['self_ms_per_step']:.2f}",
        "i_sdpa_each": f"{sdpa['self_ms_per_step'] / sdpa['calls_per_step'] * 1000:.0f}",
    }


SECTION_START = "## The float32 route's siblings in one call: an AVX2-only AMD EPYC"
SECTION = DOC[DOC.index(SECTION_START) : DOC.index("## The default route on the AVX2-only EPYC: other kernels")]
TEMPLATE = (Path(__file__).with_name("performance_amd_avx2only_section.md")).read_text(encoding="utf-8")


def test_the_section_is_its_template_filled_from_the_kept_files():
    assert SECTION == TEMPLATE.format(**figures()) + "\n"


def test_what_the_section_says_of_its_figures_holds_in_the_files():
    before, after = (bench_file(profile_name(when)) for when in ("before", "after"))
    run, int4 = bench_file(RUN), bench_file("profile-amd-avx2only-int4.json")
    assert median_step(after) < median_step(before)  # faster after
    assert (op(before, PACKED)["calls_per_step"], op(after, PACKED)["calls_per_step"]) == (210, 120)
    assert max(before["median_step_ms_per_repeat"]) == before["median_step_ms_per_repeat"][0]  # "the first repeat"
    flags = after["cpu_flags"]
    assert not [f for f in flags if f.startswith("avx512")]  # "without AVX-512"
    for profile in (before, after, int4):
        assert profile["cpu"] == "AMD EPYC" and profile["threads"] == 2 and profile["cpu_flags"] == flags
        assert profile["capability"] == "AVX2"
    assert run["machine"]["cpu_flags"] == flags and run["machine"]["torch_threads"] == 2  # "on the same machine"
    assert int4["route"] == "auto:native" and before["route"] == after["route"] == "float32:native"
    assert before["profile"]["profiled_step_ms"] < after["profile"]["profiled_step_ms"]  # "did not show the gain"
    int4_calls = op(int4, INT4)["calls_per_step"]
    assert 120 * 31 / 32 - 0.1 < int4_calls < 120  # 120 a decode step, none in the prompt's, over 32 steps
    assert run["ratios"]["lone_float32_over_vllm"]["target"] is None  # "the bench does not record as a target"
    lone = run["routes"]["float32"]["lone_decode_tokens_per_s"], run["vllm_anchor"]["lone_decode_tokens_per_s"]
    assert lone[0]["min"] < lone[1]["max"]  # "the repeats overlap"
    batched = run["routes"]["float32"]["batched_tokens_per_s"], run["vllm_anchor"]["batched_tokens_per_s"]
    assert batched[0]["min"] < batched[1]["median"] < batched[0]["median"] < batched[1]["max"]  # "within the spread"
    assert run["vllm_anchor"]["threads"] == 1  # "on twice vLLM's cores"
    assert run["ratios"]["lone_float32_over_vllm"]["value"] >= 1.0  # "met in this run"
    assert run["ratios"]["lone_auto:native_over_llamacpp"]["value"] < 1.2  # "under the 1.2× target"
    assert "oneDNN" in run["routes"]["float32"]["facts"]["dtype_reason"]
    assert PROBE_ROWS == (1, 4, 16, 64)  # the probe's rows as the section names them
