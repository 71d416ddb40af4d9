"""docs/performance.md's section "Eight clients against the step the issue started from, and prompts attended apart:
an Intel Xeon": the section is its template filled with figures recomputed here from the pairs, profile and
weight-kernel files kept in docs/bench/, and what its sentences say of them (the target missed in both kernel
sets, one native pair over it, the budget neither way met, the probes' first tokens the same) holds in the files."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from decoder_runs import step_shape
from test_performance_doc import bench_file

from model_runner.local.model.paged_step import SAVED_PAIRS_PER_ROW, rows_apart_pay

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
PAIRS, PROBE, PROMPTS_STEP = (
    "intel-8-clients-before-after.json",
    "intel-prompt-step-probe.json",
    "intel-8-prompts-step.json",
)
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


def budget() -> dict[str, float]:
    """What 1.3× would ask of the compiled step natively: the before runs' median aggregate × 1.3 sets the wall
    time of 8 × 32 tokens; the prompts' step with the first decode step (the --output-lens 2 run) and 30 more
    decode steps share it."""
    before = statistics.median(agg(b, EAGER) for b, _ in pairs("AVX-512"))
    wall_s = CLIENTS * TOKENS / (TARGET * before)
    first_s = bench_file(PROMPTS_STEP)["run"]["routes"][COMPILED]["runs"]["batched"]
    first_s = statistics.median(r["wall_s"] for r in first_s)
    step_ms = statistics.median(bench_file(PROFILE)["median_step_ms_per_repeat"])
    need_ms = (wall_s - first_s) / (TOKENS - 2) * 1000
    left_ms = (wall_s - (TOKENS - 2) * step_ms / 1000) * 1000
    return {"before": before, "wall_s": wall_s, "first_s": first_s, "step_ms": step_ms, "need_ms": need_ms,
            "left_ms": left_ms}  # fmt: skip


def saved_a_row(tokens: list[int]) -> int:
    """The query-key pairs a step of these prompts, packed, scores beyond their own, per prompt."""
    total, own = sum(tokens), sum(t * t for t in tokens)
    return (total * total - own) // len(tokens)


def probe_saved(run: dict) -> tuple[int, int]:
    """(pairs saved a row at each step, prompts a step), the prompts split evenly over the run's steps."""
    tokens, steps = run["prompt_tokens"], run["steps"]["apart"][0]
    per_step = len(tokens) // steps
    return saved_a_row(tokens[:per_step]), per_step


def one_step_probes() -> list[dict]:
    return [r for r in bench_file(PROBE)["runs"] if r["steps"] == {"packed": [1], "apart": [1]}]


def probe_margins() -> dict[str, str]:
    """How far apart lost and gained in the one-step probes, and the two-prompts-a-step run's gain and spread."""
    lost = [r for r in one_step_probes() if r["apart_over_packed"] > 1]
    gained = [r for r in one_step_probes() if r["apart_over_packed"] < 1]
    gains = [(1 - r["apart_over_packed"]) * 100 for r in gained]
    rounds = [r["apart_faster_rounds"] for r in gained]
    two = two_a_step()
    spread = two["ms_per_round"]["packed"] + two["ms_per_round"]["apart"]
    return {
        "lost_pcts": " and ".join(f"{(r['apart_over_packed'] - 1) * 100:.1f}" for r in sorted(lost, key=by_ratio)),
        "lost_rounds": " and ".join(f"{r['apart_faster_rounds']}" for r in sorted(lost, key=by_ratio)),
        "gain_lo": f"{min(gains):.1f}",
        "gain_hi": f"{max(gains):.1f}",
        "gained_rounds_lo": f"{min(rounds)}",
        "gained_rounds_hi": f"{max(rounds)}",
        "two_rounds": f"{two['apart_faster_rounds']}",
        "two_lo": f"{min(spread):,.0f}",
        "two_hi": f"{max(spread):,.0f}",
    }


def by_ratio(run: dict) -> float:
    return run["apart_over_packed"]


def two_a_step() -> dict:
    (run,) = [r for r in bench_file(PROBE)["runs"] if probe_saved(r)[1] == 2 and r["steps"]["apart"] != [1]]
    return run


def probe_row(run: dict) -> str:
    tokens = run["prompt_tokens"]
    shape = f"{len(tokens)} × {tokens[0]}" if len(set(tokens)) == 1 else f"{len(tokens)} × {min(tokens)}–{max(tokens)}"
    saved, per_step = probe_saved(run)
    where = "" if per_step == len(tokens) else f" ({per_step} prompts a step)"
    (choices,) = run["rule_apart"]
    rule = "apart" if all(choices) else "packed" if not any(choices) else "mixed"
    rounds = len(run["ms_per_round"]["apart"])
    return (
        f"| {shape} | {run['steps']['apart'][0]} | {saved:,}{where} | {rule} | "
        f"{run['median_ms']['packed']:.1f} ms | {run['median_ms']['apart']:.1f} ms | {run['apart_over_packed']:.3f} | "
        f"{run['apart_faster_rounds']} of {rounds} | {'the same' if run['same_first_tokens'] else 'differ'} |"
    )


def figures() -> dict[str, str]:
    runs = bench_file(PAIRS)["runs"]
    benches = [r["run"] for r in runs] + [bench_file(PROMPTS_STEP)["run"]]
    starts = sorted(b["started_at"] for b in benches)
    loads = [b["machine"]["load_average_start"][0] for b in benches]
    profile, b = bench_file(PROFILE), budget()
    kernels_at = bench_file(KERNELS[1])["started_at"]
    transformers = ratios("AVX-512", TRANSFORMERS, TRANSFORMERS)
    n_c, a_c = ratios("AVX-512", COMPILED), ratios("AVX2 forced", COMPILED)
    return {
        "cpu": runs[0]["run"]["machine"]["cpu"],
        "torch": runs[0]["run"]["machine"]["torch"],
        "day": starts[0][:10],
        "k_day": kernels_at[:10],
        "k_time": kernels_at[11:16],
        "t_first": starts[0][11:16],
        "t_last": starts[-1][11:16],
        "l_lo": x(min(loads)),
        "l_hi": x(max(loads)),
        "before_command": runs[0]["run"]["command"],
        "after_command": next(r["run"]["command"] for r in runs if r["step"] == "after"),
        "pair_rows": "\n".join(pair_rows("AVX-512") + pair_rows("AVX2 forced")),
        "n_c": x(statistics.median(n_c)),
        "a_c": x(statistics.median(a_c)),
        "n_c_lo": x(min(n_c)),
        "n_c_hi": x(max(n_c)),
        "a_c_pairs": f"both pairs {x(a_c[0])}" if x(a_c[0]) == x(a_c[1]) else f"{x(min(a_c))}–{x(max(a_c))}",
        "n_miss": f"{(1 - statistics.median(n_c) / TARGET) * 100:.0f}",
        "a_miss": f"{(1 - statistics.median(a_c) / TARGET) * 100:.0f}",
        "n_e": x(statistics.median(ratios("AVX-512", EAGER))),
        "a_e": x(statistics.median(ratios("AVX2 forced", EAGER))),
        "n_t": x(statistics.median(ratios("AVX-512", TRANSFORMERS, TRANSFORMERS))),
        "a_t": x(statistics.median(ratios("AVX2 forced", TRANSFORMERS, TRANSFORMERS))),
        "n_t_lo": x(min(transformers)),
        "n_t_hi": x(max(transformers)),
        "p_decode_steps": f"{profile['profile']['profiled_decode_steps']}",
        "p_gather_calls": f"{op(profile, GATHER)['calls_per_step']:.0f}",
        "k8_f16": x(kernel_ms(8, "float16") / kernel_ms(8, "int4")),
        "probe_commit": bench_file(PROBE)["commit"],
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
        "o_command": bench_file(PROMPTS_STEP)["run"]["command"],
        "o_wall": x(b["first_s"]),
        "b_before": f"{b['before']:.1f}",
        "b_target": f"{b['before'] * TARGET:.1f}",
        "b_wall": x(b["wall_s"]),
        "b_need": f"{b['need_ms']:.1f}",
        "b_step": x(b["step_ms"]),
        "b_cut": f"{(1 - b['need_ms'] / b['step_ms']) * 100:.0f}",
        "b_left": f"{b['left_ms']:.0f}",
        "saved_per_row": SAVED_PAIRS_PER_ROW,
        "probe_rows": "\n".join(probe_row(run) for run in bench_file(PROBE)["runs"]),
        **probe_margins(),
        "k1_command": bench_file(KERNELS[1])["command"],
        "k8_command": bench_file(KERNELS[8])["command"],
        "pl_lo": x(min(r["load_average_before"][0] for r in bench_file(PROBE)["runs"])),
        "pl_hi": x(max(r["load_average_before"][0] for r in bench_file(PROBE)["runs"])),
        "pl15_lo": x(min(r["load_average_before"][2] for r in bench_file(PROBE)["runs"])),
        "pl15_hi": x(max(r["load_average_before"][2] for r in bench_file(PROBE)["runs"])),
        "lost_max": max(probe_saved(r)[0] for r in one_step_probes() if r["apart_over_packed"] > 1),
        "gained_min": min(probe_saved(r)[0] for r in one_step_probes() if r["apart_over_packed"] < 1),
        "two_gain": f"{(1 - two_a_step()['apart_over_packed']) * 100:.1f}",
    }


SECTION_START = "## Eight clients against the step the issue started from, and prompts attended apart: an Intel Xeon"
SECTION = DOC[DOC.index(SECTION_START) : DOC.index("## Not measured on what serves now")]
TEMPLATE = (Path(__file__).with_name("performance_intel_8_clients_section.md")).read_text(encoding="utf-8")


def test_the_section_is_its_template_filled_from_the_kept_files():
    assert SECTION == TEMPLATE.format(**figures()) + "\n"


def test_the_runs_are_one_intel_machine_at_two_threads_and_the_commits_the_section_names():
    for r in bench_file(PAIRS)["runs"]:
        machine = r["run"]["machine"]
        assert machine["cpu"] == "Intel(R) Xeon(R) Processor" and machine["torch_threads"] == 2
        assert machine["capability"] == ("AVX2" if r["kernels"] == "AVX2 forced" else "AVX512")
        assert r["commit"] == {"before": "692ab14", "after": "5d462ac"}[r["step"]]
        assert (COMPILED in r["run"]["routes"]) == (r["step"] == "after")
    steps = bench_file(PROMPTS_STEP)["run"]
    assert steps["machine"]["capability"] == "AVX512" and steps["settings"]["output_tokens"] == 2
    for facts in [bench_file(PROFILE), *map(bench_file, KERNELS.values()), *bench_file(PROBE)["runs"]]:
        assert facts["cpu"] == "Intel(R) Xeon(R) Processor" and facts["capability"] == "AVX512"
        assert facts.get("threads") == 2
    assert bench_file(PROFILE)["compiled"]["state"] == "on" and bench_file(PROFILE)["clients"] == CLIENTS


def test_what_the_sentences_say_holds_in_the_files():
    for kernels in ("AVX-512", "AVX2 forced"):  # "missed in both"
        assert statistics.median(ratios(kernels, COMPILED)) < TARGET
    native = ratios("AVX-512", COMPILED)  # "one native pair of four reached it, where its before run was slowest"
    reached = [i for i, r in enumerate(native) if r >= TARGET]
    befores = [agg(b, EAGER) for b, _ in pairs("AVX-512")]
    assert len(reached) == 1 and befores[reached[0]] == min(befores)
    b = budget()
    assert b["need_ms"] < b["step_ms"] and b["left_ms"] < b["first_s"] * 1000  # neither way fits today
    for run in bench_file(PROBE)["runs"]:  # "the first tokens the same" in every probe
        assert run["same_first_tokens"]
    lost = [probe_saved(r)[0] for r in one_step_probes() if r["apart_over_packed"] > 1]
    gained = [probe_saved(r)[0] for r in one_step_probes() if r["apart_over_packed"] < 1]
    assert max(lost) < SAVED_PAIRS_PER_ROW <= min(gained)  # "hence the count a row"
    for run in bench_file(PROBE)["runs"]:  # the recorded choices are the rule's today, and saved ≥ own held
        tokens, per_step = run["prompt_tokens"], probe_saved(run)[1]
        step = tokens[:per_step]
        assert sum(step) ** 2 - sum(t * t for t in step) >= sum(t * t for t in step)
        assert run["rule_apart"] == [
            [rows_apart_pay(step_shape([(t, t) for t in tokens[:per_step]]))] * len(run["rule_apart"][0])
        ]
    two = two_a_step()  # two prompts a step: exactly twice the rows' own, which the rule sends apart
    tokens = two["prompt_tokens"][:2]
    assert sum(tokens) ** 2 == 2 * sum(t * t for t in tokens) and all(all(c) for c in two["rule_apart"])
    eight = bench_file(PROBE)["runs"][0]  # the 8-client shape: apart in 5d462ac's rule too (saved ≥ own)
    tokens = eight["prompt_tokens"]
    assert len(tokens) == CLIENTS and eight["steps"]["apart"] == [1]
    assert sum(tokens) ** 2 - sum(t * t for t in tokens) >= sum(t * t for t in tokens)
    assert rows_apart_pay(step_shape([(t, t) for t in tokens]))
