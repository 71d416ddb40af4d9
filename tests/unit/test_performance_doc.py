"""docs/performance.md states the present: every figure it quotes under "The figures the shipped recordings
hold" is recomputed here from the shipped recording it names and must appear as written; the older runs it
does not quote live in the dated history file it links; the structured-output mask's section is recomputed from
the `kvscope bench --structured` run kept in docs/bench/."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from serving_experiments.evidence import CARRIED, floor_problems, point_evidence

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
HISTORY = ROOT / "docs/history/2026-12-02-performance.md"

pytestmark = pytest.mark.unit


def load(name: str) -> dict:
    return json.loads((ROOT / "static/data" / name).read_text(encoding="utf-8"))


BENCH = ROOT / "docs/bench"  # the bench and profile runs the page quotes, kept beside it


def bench_file(name: str) -> dict:
    return json.loads((BENCH / name).read_text(encoding="utf-8"))


def pct_change(after: float, before: float) -> str:
    r = after / before - 1
    return f"{'+' if r >= 0 else '−'}{abs(r) * 100:.0f} %"


def figures() -> dict[str, str]:
    """Every figure the page quotes, worked out from the shipped recordings, as the page writes it."""
    serving = load("serving-trace.json")
    ex = {name: body["result"] for name, body in serving["experiments"].items()}
    wb = ex["why_batch"]["points"]
    median_agg = [p["batch"] * 1000 / p["step_ms_median"] for p in wb]
    roof = ex["why_batch"]["roofline"]
    decodes = {p["batch"]: p for p in roof["points"] if p["phase"] == "decode"}
    prefill = next(p for p in roof["points"] if p["phase"] == "prefill")
    pricing, fit = ex["pricing"], ex["attention_cost"]["fit"]
    steps = {p["cached_positions"]: p["step_ms"] for p in ex["attention_cost"]["points"]}
    ch = ex["chunked_prefill"]
    runs = ch["runs"]
    threshold = 1.5 * statistics.median(runs["off"]["gaps_ms"][0])
    over = {m: sum(g > threshold for g in runs[m]["gaps_ms"][0]) for m in ("off", "on")}
    inv = load("invariance-trace.json")["experiment"]["result"]["runs"]
    trace = load("trace-example.json")
    tokens = [e for e in trace["events"] if e["type"] == "token"]
    pre = next(e for e in trace["events"] if e["type"] == "prefill_end")
    return {
        "why_rows": "\n".join(
            f"| {p['batch']} | {p['step_ms']:.1f} ms | {p['step_ms_median']:.1f} ms | {p['aggregate_tps']:.1f} | {m:.1f} |"
            for p, m in zip(wb, median_agg)
        ),
        "fast_change": f"{wb[-2]['aggregate_tps']:.1f} to {wb[-1]['aggregate_tps']:.1f} tok/s, "
        + pct_change(wb[-1]["aggregate_tps"], wb[-2]["aggregate_tps"]),
        "median_change": f"{median_agg[-2]:.1f} to {median_agg[-1]:.1f} tok/s, "
        + pct_change(median_agg[-1], median_agg[-2]),
        "bandwidth": f"{roof['bandwidth_bytes_s'] / 1e9:.1f}",
        "peak": f"{roof['peak_flops_s'] / 1e9:.0f}",
        "floor_rows": "\n".join(
            f"| {name} | {p['kernel_ms']:.1f} ms | {p['memory_ms']:.1f} ms | {p['step_ms']:.1f} ms |"
            for name, p in [(f"prefill, {prefill['tokens']} tokens", prefill)]
            + [(f"decode, batch {b}", decodes[b]) for b in sorted(decodes)]
        ),
        "lone_spread": f"{wb[0]['step_ms_median'] / wb[0]['step_ms']:.1f}",
        "pricing_prompt": f"{pricing['prompt_tokens']}",
        "pricing_new": f"{pricing['new_tokens']}",
        "prefill_tok": f"{pricing['prefill_ms_per_token']:.2f}",
        "decode_tok": f"{pricing['decode_ms_per_token']:.1f}",
        "ratio": f"{pricing['decode_ms_per_token'] / pricing['prefill_ms_per_token']:.1f}",
        "intercept": f"{fit['intercept_ms']:.1f}",
        "slope": f"{fit['slope_us_per_1k_positions'] / 1000:.1f}",
        "s1024": f"{steps[1028.0]:.1f}",
        "s512": f"{steps[516.0]:.1f}",
        "chunk": f"{ch['chunk_size']}",
        "long": f"{ch['long_prompt_tokens']}",
        "gap_off": f"{runs['off']['max_gap_ms']:.0f}",
        "gap_on": f"{runs['on']['max_gap_ms']:.0f}",
        "ttft_off": f"{runs['off']['long_ttft_ms']:,.0f}",
        "ttft_on": f"{runs['on']['long_ttft_ms']:,.0f}",
        "over_off": f"{over['off']}",
        "over_on": f"{over['on']}",
        "inv_da": f"{inv['default']['step_ms_median']['alone']:.1f}",
        "inv_db": f"{inv['default']['step_ms_median']['batched']:.1f}",
        "inv_ia": f"{inv['invariant']['step_ms_median']['alone']:.1f}",
        "inv_ib": f"{inv['invariant']['step_ms_median']['batched']:.1f}",
        "inv_same_d": f"{sum(r['same_answer'] for r in inv['default']['requests'])}",
        "inv_same_i": f"{sum(r['same_answer'] for r in inv['invariant']['requests'])}",
        "trace_prompt": f"{pre['tokens']}",
        "trace_pre": f"{pre['ms']:.1f}",
        "trace_step": f"{statistics.median(t['step_ms'] for t in tokens[1:]):.1f}",
        "trace_tokens": f"{len(tokens)}",
        "trace_steps": f"{len(tokens) - 1}",
    }


def mask_figures() -> dict[str, str]:
    """The structured-output section's figures, from the `kvscope bench --structured` run kept beside the page."""
    run = bench_file("structured-mask.json")
    rows, machine, median = run["cases"], run["machine"], statistics.median
    lone = [r for r in rows if r["clients"] == 1]
    lone_schema = next(r for r in lone if r["case"] == "json_schema")
    mask, compile_ms = run["mask_alone"]["json_schema"], run["compile_ms"]
    plain_lone = [x for r in lone for x in r["plain_step_ms"]]
    as_written = {
        "cores": machine["cpu_count"],
        "threads": machine["torch_threads"],
        "load_start": machine["load_average_start"][0],
        "load_end": machine["load_average_end"][0],
        "mask_steps": mask["steps"],
        "parsed": sum(a["parsed"] for a in run["answers"].values()),
        "answers": sum(a["answers"] for a in run["answers"].values()),
    }
    return {name: f"{value}" for name, value in as_written.items()} | {
        "command": run["command"],
        "started": run["started_at"][:16].replace("T", " ") + " UTC",
        "cpu": machine["cpu_model"],
        "plain_lo": f"{min(plain_lone):.1f}",
        "plain_hi": f"{max(plain_lone):.1f}",
        "mask_rows": "\n".join(
            f"| {r['case']} | {r['clients']} | {median(r['plain_step_ms']):.1f} ms | "
            f"{median(r['constrained_step_ms']):.1f} ms | "
            f"{r['ratio']['median']:.2f} [{r['ratio']['min']:.2f}–{r['ratio']['max']:.2f}] |"
            for r in rows
        ),
        "fill": f"{mask['fill_ms_median']:.3f}",
        "whole": f"{mask['mask_step_ms_median']:.2f}",
        "share": f"{mask['mask_step_ms_median'] / median(lone_schema['plain_step_ms']) * 100:.1f} %",
        "compiler": f"{compile_ms['compiler_ms']:.0f}",
        "c_schema": f"{compile_ms['json_schema']:.2f}",
        "c_choice": f"{compile_ms['choice']:.2f}",
    }


PROFILES = [(kernels, when) for kernels in ("AVX-512", "AVX2") for when in ("before", "after")]


def profile_file(kernels: str, when: str) -> str:
    return f"profile-lone-decode-{kernels.lower().replace('-', '')}-{when}.json"


def self_ms(profile: dict, op: str) -> float:
    return next(o["self_ms_per_step"] for o in profile["profile"]["ops"] if o["op"] == op)


def calls(profile: dict, op: str) -> float:
    return next(o["calls_per_step"] for o in profile["profile"]["ops"] if o["op"] == op)


KERNELS = {
    "int4": "aten::_weight_int4pack_mm_for_cpu",
    "int8": "aten::_weight_int8pack_mm",
    "sdpa": "aten::_scaled_dot_product_flash_attention_for_cpu",
    "gather": "aten::index_select",
    "topk": "aten::topk",
}


def token_gaps() -> list[list[float]]:
    answers = bench_file("llamacpp-token-gaps.json")["answers"]
    return [[b - a for a, b in zip(x["stamps_ms"], x["stamps_ms"][1:])] for x in answers]


def lone_figures() -> dict[str, str]:
    """The lone decode section's figures, from the profiles and the bench run kept in docs/bench/."""
    median = statistics.median
    rows = []
    for kernels, when in PROFILES:
        run = bench_file(profile_file(kernels, when))
        steps = ", ".join(f"{t:.2f}" for t in run["median_step_ms_per_repeat"])
        rows.append(
            f"| {kernels} ({run['capability']}) | {when} | {steps} ms | {run['profile']['aten_calls_per_step']:,} "
            f"| `{profile_file(kernels, when)}` |"
        )
    after, avx2 = bench_file(profile_file("AVX-512", "after")), bench_file(profile_file("AVX2", "after"))
    kernels_ms = sum(self_ms(after, op) for op in KERNELS.values())
    after_step = median(after["median_step_ms_per_repeat"])
    bench = bench_file("lone-decode-llamacpp.json")
    native, f32, ratios = bench["routes"]["auto:native"], bench["routes"]["float32"], bench["ratios"]
    llama = bench["anchor"]["lone_decode_tokens_per_s"]
    lone, batched = ratios["lone_auto:native_over_float32"]["spread"], ratios["batched_auto:native_over_float32"]
    fastest = [min(g) for g in token_gaps()]
    gaps = token_gaps()
    answer_medians = [median(g) for g in gaps]
    return {
        "flags": ", ".join(after["cpu_flags"]),
        "answer_median_lo": f"{min(answer_medians):.2f}",
        "answer_median_hi": f"{max(answer_medians):.2f}",
        "gap_prompt": f"{bench_file('llamacpp-token-gaps.json')['prompt_tokens']}",
        "weights_ms": f"{self_ms(after, KERNELS['int4']) + self_ms(after, KERNELS['int8']):.2f}",
        "llama_ms": f"{1000 / llama['median']:.1f}",
        "profile_rows": "\n".join(rows),
        **{f"{name}_ms": f"{self_ms(after, op):.2f}" for name, op in KERNELS.items()},
        "int4_calls": f"{calls(after, KERNELS['int4']):.1f}",
        "kernels_ms": f"{kernels_ms:.1f}",
        "rest_ms": f"{after_step - kernels_ms:.1f}",
        "after_step": f"{after_step:.2f}",
        "after_calls": f"{after['profile']['aten_calls_per_step']:,}",
        "int4_avx2_ms": f"{self_ms(avx2, KERNELS['int4']):.2f}",
        "bench_command": bench["command"],
        "bench_started": bench["started_at"][:16].replace("T", " ") + " UTC",
        "bench_load_start": f"{bench['machine']['load_average_start'][0]}",
        "bench_load_end": f"{bench['machine']['load_average_end'][0]}",
        "native_tps": f"{native['lone_decode_tokens_per_s']['median']:.1f}",
        "native_tps_lo": f"{native['lone_decode_tokens_per_s']['min']:.1f}",
        "native_tps_hi": f"{native['lone_decode_tokens_per_s']['max']:.1f}",
        "native_step": f"{native['step_ms']['median']:.1f}",
        "f32_tps": f"{f32['lone_decode_tokens_per_s']['median']:.1f}",
        "lone_ratio": f"{lone['median']:.2f}×",
        "lone_ratio_lo": f"{lone['min']:.2f}",
        "lone_ratio_hi": f"{lone['max']:.2f}",
        "batched_ratio": f"{batched['spread']['median']:.2f}×",
        "batched_ratio_lo": f"{batched['spread']['min']:.2f}",
        "batched_ratio_hi": f"{batched['spread']['max']:.2f}",
        "native_batched": f"{native['batched_tokens_per_s']['median']:.1f}",
        "llama_tps": f"{llama['median']:.1f}",
        "llama_lo": f"{llama['min']:.1f}",
        "llama_hi": f"{llama['max']:.1f}",
        "llama_ratio": f"{ratios['lone_auto:native_over_llamacpp']['value']:.2f}×",
        "gap_lo": f"{min(fastest):.2f}",
        "gap_hi": f"{max(fastest):.2f}",
        "stalls": f"{sum(g > 20 for gaps in token_gaps() for g in gaps)}",
        "gaps": f"{sum(len(gaps) for gaps in token_gaps())}",
    }


def vllm_figures(name: str = "lone-decode-vllm.json") -> dict[str, str]:
    """A vLLM paragraph's figures, from the `--anchor vllm` run kept beside the page as `name`."""
    run = bench_file(name)
    vllm, f32, ratios = run["vllm_anchor"], run["routes"]["float32"], run["ratios"]
    lone = vllm["lone_decode_tokens_per_s"]
    return {
        "v_command": run["command"],
        "v_started": run["started_at"][:16].replace("T", " ") + " UTC",
        "v_load_start": f"{run['machine']['load_average_start'][0]}",
        "v_load_end": f"{run['machine']['load_average_end'][0]}",
        "v_version": vllm["engine"].split("==")[1].split(")")[0],
        "v_threads": f"{vllm['threads']}",
        "v_lone": f"{lone['median']:.1f}",
        "v_lone_lo": f"{lone['min']:.1f}",
        "v_lone_hi": f"{lone['max']:.1f}",
        "v_n": f"{lone['n']}",
        "v_batched": f"{vllm['batched_tokens_per_s']['median']:.1f}",
        "f_lone": f"{f32['lone_decode_tokens_per_s']['median']:.1f}",
        "f_batched": f"{f32['batched_tokens_per_s']['median']:.1f}",
        "v_lone_ratio": f"{ratios['lone_float32_over_vllm']['value']:.2f}×",
        "v_batched_ratio": f"{ratios['batched_float32_over_vllm']['value']:.2f}×",
        "v_same": f"{vllm['agreement']['identical']}",
    }


def test_the_lone_decode_sections_readings_are_the_files():
    """What the section says of its figures holds in the kept files: the step got faster on both kernels; the
    anchor's repeats spread too wide for a ratio; its fastest tokens are about a third of our median step and
    under our int4 and int8 passes' own time, and its median token over it; every profile names the CPU, its flags
    and its capability."""
    median = statistics.median
    for kernels in ("AVX-512", "AVX2"):
        before, after = (bench_file(profile_file(kernels, w)) for w in ("before", "after"))
        assert median(after["median_step_ms_per_repeat"]) < median(before["median_step_ms_per_repeat"])
        assert after["profile"]["aten_calls_per_step"] < before["profile"]["aten_calls_per_step"]
        for run in (before, after):
            assert run["cpu"] == "Intel(R) Xeon(R) Processor" and "avx512f" in run["cpu_flags"]
            assert run["capability"] == ("AVX512" if kernels == "AVX-512" else "AVX2") and run["threads"] == 2
    bench = bench_file("lone-decode-llamacpp.json")
    llama = bench["anchor"]["lone_decode_tokens_per_s"]
    assert llama["max"] > 2 * llama["min"]  # "not a resolved ratio"
    fastest = max(min(g) for g in token_gaps())
    step = bench["routes"]["auto:native"]["step_ms"]["median"]
    assert 0.25 < min(min(g) for g in token_gaps()) / step and fastest / step < 0.4  # "about a third"
    after = bench_file(profile_file("AVX-512", "after"))
    weights = self_ms(after, KERNELS["int4"]) + self_ms(after, KERNELS["int8"])
    assert fastest < weights < 1000 / llama["median"]  # more than its fastest token; under its median one
    for run in (bench_file(profile_file(k, w)) for k, w in PROFILES):
        assert run["cpu_flags"] == after["cpu_flags"]  # one machine: the flags the page lists are every file's


def test_the_mask_cost_sections_reading_of_the_ranges_is_the_runs():
    """Every case's constrained / plain range straddles 1, as the page says; every constrained answer parsed."""
    run = bench_file("structured-mask.json")
    assert all(r["ratio"]["min"] < 1 < r["ratio"]["max"] for r in run["cases"])
    assert "Every case's range straddles 1" in DOC
    assert all(a["parsed"] == a["answers"] for a in run["answers"].values())


# Each figure in the sentence that quotes it, as the page writes it.
QUOTED = [
    "{why_rows}",
    "rose from batch 8 to 16 ({fast_change})",
    "by the median they barely moved\n({median_change})",
    "The median\nstep of batch 1 is {lone_spread} times its fastest",
    "**{bandwidth} GB/s**",
    "**{peak} GFLOP/s**",
    "{floor_rows}",
    "{pricing_prompt} prompt tokens, {pricing_new} new): **{prefill_tok} ms**",
    "**{decode_tok} ms** a decode token, a ratio of **{ratio}**",
    "**{intercept} ms** with no cache and **{slope} ms** more per 1,000",
    "(the 1,028-position step, {s1024} ms, is\nfaster than the 516-position one, {s512} ms)",
    "chunks of {chunk} tokens, a {long}-token prompt",
    "**{gap_off} ms** to **{gap_on} ms**",
    "from **{ttft_off} ms** to **{ttft_on} ms**",
    "**{over_off}** without chunking, **{over_on}** with it",
    "**{inv_da} ms** alone and **{inv_db} ms** in the batch by default, **{inv_ia} ms** and\n**{inv_ib} ms**",
    "{inv_same_d} of 8 batched answers were the lone ones by default, {inv_same_i}\nof 8",
    "{trace_prompt} prompt tokens): prefill **{trace_pre} ms**",
    "its {trace_tokens} tokens took a median decode step of **{trace_step} ms** over the {trace_steps} steps after the first",
    # the structured-output mask's section, from the kept `kvscope bench --structured` run
    "(`{command}`,\n{started}) ran on an **{cpu}** with {cores} cores (AVX-512; torch reports AVX512), {threads} "
    "torch threads",
    "a load average of **{load_start}** before and **{load_end}** after",
    "the median step of its lone plain phases ranged from {plain_lo} to\n{plain_hi} ms",
    "{mask_rows}",
    "**{fill} ms** to fill the bitmask and **{whole} ms** for the whole per-request mask step",
    "over the schema's {mask_steps} steps: **{share}** of the lone plain step",
    "took **{compiler} ms**; the schema then compiled in **{c_schema} ms** and the\nchoice in **{c_choice} ms**. "
    "{parsed} of {answers} constrained answers parsed",
]


# The lone decode section's figures, from the profiles and the bench run kept in docs/bench/.
LONE_QUOTED = [
    "{profile_rows}",
    "torch's int4 kernel **{int4_ms} ms** over {int4_calls} calls",
    "the head's int8 pass\n**{int8_ms} ms**, attention (sdpa) **{sdpa_ms} ms**, `index_select` **{gather_ms} ms**",
    "top-k **{topk_ms} ms** (the head's and the sampler's): **{kernels_ms} ms** in\nthese kernels. Set beside the "
    "timed repeats' median step, {after_step} ms, that leaves about **{rest_ms} ms**",
    "{after_calls} aten calls a step is every call",
    "as each file lists them:\n{flags}), 2 torch threads",
    "the answers' median gaps ran from {answer_median_lo} to {answer_median_hi} ms",
    "a separate run, {gap_prompt} prompt tokens, after the bench run",
    "our int4 and int8 passes alone take\n**{weights_ms} ms**, more than its fastest token",
    "Against its median token ({llama_ms} ms) the weight kernels fit",
    "With AVX2 forced the int4 kernel alone takes **{int4_avx2_ms} ms** a step.",
    "one `{bench_command}` run with `--anchor llamacpp` ({bench_started}, load {bench_load_start} → {bench_load_end},",
    "**{native_tps} tok/s** on the default route (median of 5 repeats, {native_tps_lo}–{native_tps_hi}), a median step\n"
    "of **{native_step} ms**; float32 **{f32_tps} tok/s**; the default route over float32 **{lone_ratio}**\n"
    "[{lone_ratio_lo}–{lone_ratio_hi}] alone and **{batched_ratio}** [{batched_ratio_lo}–{batched_ratio_hi}] with 8\n"
    "clients ({native_batched} tok/s in all)",
    "**{llama_tps} tok/s** with its repeats spread from {llama_lo} to {llama_hi} tok/s, so the quoted\n{llama_ratio}",
    "fastest gap between tokens was {gap_lo}–{gap_hi} ms in every answer, but {stalls} of its {gaps} gaps were over\n20 ms",
]


@pytest.mark.parametrize("sentence", QUOTED)
def test_each_quoted_figure_is_the_shipped_recordings(sentence):
    assert sentence.format(**figures(), **mask_figures()) in DOC


VLLM_QUOTED = [
    "one `{v_command}` run with `--anchor vllm` ({v_started}, load\n{v_load_start} → {v_load_end},",
    "vLLM {v_version} on float32, its worker on {v_threads} core as the bench starts it",
    "**{v_lone} tok/s** ({v_lone_lo}–{v_lone_hi} over {v_n} repeats) and 8 clients at **{v_batched} tok/s**; our\n"
    "float32 route on 2 threads **{f_lone} tok/s** and **{f_batched} tok/s**: **{v_lone_ratio}** and\n"
    "**{v_batched_ratio}** vLLM's medians, on twice its cores (computed); vLLM's greedy answers were our float32\n"
    "route's on {v_same} of 24 quality prompts",
]


@pytest.mark.parametrize("sentence", LONE_QUOTED)
def test_each_lone_decode_figure_is_the_kept_runs(sentence):
    assert sentence.format(**lone_figures()) in DOC


@pytest.mark.parametrize("sentence", VLLM_QUOTED)
def test_each_vllm_figure_is_the_kept_run(sentence):
    assert sentence.format(**vllm_figures()) in DOC


def test_the_vllm_run_is_the_one_the_page_describes():
    run = bench_file("lone-decode-vllm.json")
    assert run["vllm_anchor"]["threads"] == 1 and run["machine"]["torch_threads"] == 2  # "twice its cores"
    assert run["vllm_anchor"]["agreement"]["compared"] == 24


def test_the_floors_pass_their_check_and_the_verdicts_named_are_the_carried_ones():
    """The page says the shipped floors pass their check, and names each decode batch's verdict only where the
    evidence carries it (the same verdict at the fastest and the median step), the rest as mixed."""
    result = load("serving-trace.json")["experiments"]["why_batch"]["result"]
    roof, steps = result["roofline"], {p["batch"]: p["steps_measured"] for p in result["points"]}
    assert floor_problems(roof["points"]) == [] and "These floors pass their own check" in DOC
    words = {"overhead": "**overhead**", "kernel": "its **kernels**"}
    carried, mixed = {}, []
    for p in (p for p in roof["points"] if p["phase"] == "decode"):
        evidence = point_evidence({"steps_measured": steps[p["batch"]], **p}, True, False)
        if evidence == CARRIED:
            carried.setdefault(words[p["held_by"]], []).append(p["batch"])
        else:
            mixed.append(p["batch"])
    said = " ".join(DOC.split())
    for verdict, batches in carried.items():
        names = " and ".join(str(b) for b in batches)
        assert f"batch {names} {'are' if len(batches) > 1 else 'is'} {verdict}" in said or (
            f"batch {names} is held by {verdict}" in said
        ), (verdict, batches)
    assert f"batch {' and '.join(str(b) for b in mixed)} are mixed" in said


def test_the_recordings_machine_and_decoder_are_the_files_own():
    for name in ("serving-trace.json", "invariance-trace.json", "trace-example.json"):
        on = load(name)["recorded_on"]
        assert on["decoder"] == "the native step" and "**the native step** (the default decoder)" in DOC
        assert on["cpu_capability"] == "AVX512" and on["machine"].startswith("Intel(R) Xeon(R) Processor")
        assert on["uptime"].startswith("20:") and "copied_from" not in on  # this evening's run, not a copy
        assert "edited_after_recording" not in on
    on = load("serving-trace.json")["recorded_on"]
    assert on["date"].startswith("2026-12-02T20:29") and "ending at **20:29 UTC** (the serving recording)" in DOC
    assert f"**{on['load_1m']}**" in DOC and f"**{on['load_1m_end']}**" in DOC


def test_the_superseded_runs_are_dated_history_the_page_links():
    assert HISTORY.exists() and "history/2026-12-02-performance.md" in DOC
    text = HISTORY.read_text(encoding="utf-8")
    assert text.startswith("# History:") and "superseded" in text.split("\n\n")[1]


def test_every_section_a_file_cites_on_this_page_is_one_of_its_headings():
    """A doc or code comment that sends the reader to a named section of docs/performance.md finds it there,
    not only in the history file the older sections moved to."""
    import re

    headings = [line.lstrip("#").strip() for line in DOC.splitlines() if line.startswith("#")]
    cite = re.compile(r"(?<!history/2026-12-02-)performance\.md`?,?\s+\"([^\"]+)\"")
    files = [*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("model_runner/**/*.py"), *ROOT.glob("bench/*.py")]
    stale = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in cite.findall(path.read_text(encoding="utf-8").replace("\n", " "))
        if not any(h.startswith(name) for h in headings)
    ]
    assert stale == []
