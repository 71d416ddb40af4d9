"""What a `kvscope bench --batching` / `--class` run adds up to and how it is shown: each ratio's median
over the repeats judged against its target, the report's JSON contract (checked with report.validate
before the file is written) and the readable tables."""

from __future__ import annotations

from typing import TextIO

from model_runner.protocol.metrics import percentile

from . import report as floor
from .class_scenario import EQUALITY, RUN, SCENARIO, eq_text, print_class
from .report import INT, OPT_NUM, STR, fmt_num, fmt_ratio, judged, report_schema, spread

# Targets from the issue (benchmarks: reported as met or missed, never asserted).
SPEEDUP_GOALS = {8: ("min", 3.0), 16: ("min", 4.0)}  # batched tokens/s over one at a time
HF_GOAL = ("min", 0.95)  # engine tokens/s over transformers' generate_batch
LONE_GOAL = ("max", 1.10)  # a lone client's decode step over the bare loop's
CLASS_TTFT_GOAL = ("max", 0.15)  # class scenario p99 TTFT, batched over one at a time

OPT_RATIOS = {"type": "object", "additionalProperties": OPT_NUM}
THROUGHPUT = {
    "type": "object",
    "required": ["clients", "repeat", "order", "batched", "serial", "hf", "greedy", "ratios"],
    "properties": {
        "clients": INT,
        "repeat": INT,
        "order": {"type": "array", "items": STR},
        "batched": RUN,
        "serial": RUN,
        "hf": {**RUN, "type": ["object", "null"]},
        "greedy": {
            "type": "object",
            "required": ["batched_vs_serial", "hf_vs_serial"],
            "properties": {"batched_vs_serial": EQUALITY, "hf_vs_serial": {**EQUALITY, "type": ["object", "null"]}},
        },
        "ratios": {**OPT_RATIOS, "required": ["batched_over_serial", "batched_over_hf"]},
    },
}
SCHEMA = report_schema(
    "kvscope-bench-batching",
    ["in-process"],
    model=["name", "params"],
    settings=["prompt_tokens_target", "output_tokens", "concurrency", "repeats", "policy", "kv_blocks", "seed"]
    + ["arrival_s"],
    throughput={"type": "array", "items": THROUGHPUT},
    lone={"type": ["object", "null"], "required": ["comparisons"]},
    **{
        "class": {
            "type": ["object", "null"],
            "required": ["clients", "requests", "scenarios"],
            "properties": {
                "clients": INT,
                "requests": {"type": "array"},
                "scenarios": {"type": "object", "additionalProperties": SCENARIO},
            },
        }
    },
)


def ratios(throughput: list[dict], lone: dict | None, scenario: dict | None) -> dict[str, dict]:
    """Each ratio's median over the repeats with its min-max, beside its target."""
    report = {}
    for n in sorted({t["clients"] for t in throughput}):
        rows = [t["ratios"] for t in throughput if t["clients"] == n]
        for key, text, goal in (
            (
                "batched_over_serial",
                f"{n} clients: batched tokens/s / one at a time (max_num_seqs=1)",
                SPEEDUP_GOALS.get(n),
            ),
            ("batched_over_hf", f"{n} clients: engine tokens/s / transformers generate_batch", HF_GOAL),
            ("hf_over_serial", f"{n} clients: generate_batch tokens/s / engine one at a time", None),
        ):
            values = [r[key] for r in rows if r[key] is not None]
            report[f"{key}_{n}"] = _judge(text, values, goal)
    if lone is not None:
        values = [
            c["ratios"]["engine_step_over_bare"]
            for c in lone["comparisons"]
            if c["ratios"]["engine_step_over_bare"] is not None
        ]
        report["lone_step_over_bare"] = _judge(
            "lone client: engine decode step / bare loop step (medians)", values, LONE_GOAL
        )
    for name, sc in ((scenario or {}).get("scenarios") or {}).items():
        value = sc["ratios"]["ttft_p99_over_serial"]
        report[f"class_{name}_ttft_p99_over_serial"] = _judge(
            f"class, {name}: p99 TTFT batched / one at a time", [] if value is None else [value], CLASS_TTFT_GOAL
        )
    return report


def _judge(text: str, values: list[float], goal) -> dict:
    return judged(text, spread(values), percentile(values, 50), goal)


# ---- the tables ----------------------------------------------------------------------------------


def print_report(report: dict, out: TextIO) -> None:
    m, s = report["model"], report["settings"]
    what = f"{m['name']}, {m['params'] / 1e6:.1f}M parameters, {m['dtype']} on {m['device_name']}; in-process engine"
    floor.print_head(f"\nkvscope bench (continuous batching): {what}", report, out)
    print(f"policy: {', '.join(f'{k}={v}' for k, v in s['policy'].items())}; KV pool {s['kv_blocks']} blocks", file=out)
    if report["throughput"]:
        _throughput(report["throughput"], s, out)
    if report["lone"]:
        _lone(report["lone"], out)
    if report["class"]:
        print_class(report["class"], out)
    _ratios(report["ratios"], out)
    floor.print_footer(report, out, noun="engine requests")


def _throughput(rows: list[dict], s: dict, out: TextIO) -> None:
    print(
        f"\nAggregate tokens/s, the same requests (prompts of {min(s['prompt_tokens'])}-{max(s['prompt_tokens'])} "
        f"tokens, up to {s['output_tokens']} new) batched, one at a time (max_num_seqs=1) and through transformers' "
        "generate_batch; greedy = requests token-for-token identical to one at a time",
        file=out,
    )
    print(
        "  (HF tokens/s over its generation span, first request created -> last finished; 'HF call' over the "
        "whole generate_batch call, manager start and stop included)",
        file=out,
    )
    print(
        f"  {'clients':>7} {'rep':>3} {'order':<22} | {'batched':>8} {'serial':>7} {'HF':>7} {'HF call':>7} tok/s | "
        f"{'b/serial':>8} {'b/HF':>6} {'HF/serial':>9} | {'steps b/s':>9} | greedy b=s HF=s",
        file=out,
    )
    for r in rows:
        hf, q, greedy = r["hf"] or {}, r["ratios"], r["greedy"]
        tps = [fmt_num(x) for x in (r["batched"]["tokens_per_s"], r["serial"]["tokens_per_s"], hf.get("tokens_per_s"))]
        over = [fmt_num(q[key], 2) for key in ("batched_over_serial", "batched_over_hf", "hf_over_serial")]
        row = f"  {r['clients']:>7} {r['repeat'] + 1:>3} {','.join(r['order']):<22} | {tps[0]:>8} {tps[1]:>7} {tps[2]:>7} "
        row += f"{fmt_num(hf.get('call_tokens_per_s')):>7}       | {over[0]:>7}x {over[1]:>5}x {over[2]:>8}x | "
        row += f"{r['batched']['steps']:>4}/{r['serial']['steps']:<4} | {eq_text(greedy['batched_vs_serial']):>10} "
        print(row + f"{eq_text(greedy['hf_vs_serial']):>4}", file=out)


def _lone(lone: dict, out: TextIO) -> None:
    print(
        f"\nLone client ({lone['prompt_tokens']}-token prompt, up to {lone['output_tokens_target']} new): engine "
        "(max_num_seqs=1, stepped on the bare loop's thread) vs the bare greedy loop",
        file=out,
    )
    for c in lone["comparisons"]:
        engine, bare = ((c[side] or {}).get("step_ms_median") for side in ("engine", "bare_loop"))
        line = f"  repeat {c['repeat'] + 1} ({','.join(c['order'])}): step ms engine {fmt_num(engine)}, bare "
        line += f"{fmt_num(bare)} -> {fmt_num(c['ratios']['engine_step_over_bare'], 3)}x; greedy identical: "
        print(line + str(c["greedy_identical"]), file=out)


def _ratios(ratios: dict, out: TextIO) -> None:
    print("\nRatios: median [min-max] over the repeats, against the targets (benchmarks, not tests)", file=out)
    for r in ratios.values():
        shown = fmt_ratio(r["spread"], 3)
        print(f"  {r['what']:<66} {shown:>24} {floor.goal_text(r):>8} {floor.verdict_text(r)}", file=out)
