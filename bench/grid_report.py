"""What the grid's run adds up to and how it is shown: each ratio's median and spread over the repetitions
judged against its target, the readable tables (definitions first, then every cell's distributions and
counts, the baselines, the ratios, the estimates, the no-cache probe), the JSON file (checked against
grid.SCHEMA before it is written) and the optional plot."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import TextIO

from model_runner.protocol.metrics import percentile

from . import report as floor
from .grid import SCHEMA
from .report import DEFINITIONS, METRICS, fmt_num, fmt_ratio, judged, spread

TARGETS = {  # benchmark targets from the issue; reported as met or missed, never asserted
    "engine_step_over_bare": ("max", 1.03),
    "engine_tps_over_generate": ("min", 1.10),
    "delivery_p95_ms": ("max", 30.0),
}


def ratio_report(
    comparisons: list[dict], cells: list[dict], delivery: tuple[list[float], list[float]], mode: str
) -> dict[str, dict]:
    """Each ratio's median over the repetitions with its min-max, beside its target where it has
    one; delivery (upper and lower bounds, every token received) is judged by its p95, with the
    per-cell p95s as its spread."""
    what = {
        "engine_step_over_bare": "engine decode step / bare loop step (medians of token-to-token gaps)",
        "engine_step_over_bare_p10": "the same with 10th percentiles (less swayed by other busy processes)",
        "engine_outside_over_model": "engine per-token work outside model+sampler / model+sampler step, "
        "token by token (immune to drift)",
        "engine_tps_over_generate": "engine tokens/s / generate+streamer tokens/s (start -> whole answer)",
        "bare_tps_over_generate": "bare loop tokens/s / generate+streamer tokens/s",
        "decode_fraction_of_copy": "engine decode bytes read per second / machine copy bandwidth (estimate)",
        "prefill_fraction_of_matmul": "engine prefill FLOP/s / machine matmul FLOP/s (estimate)",
    }
    report = {}
    for key, text in what.items():
        values = [c["ratios"][key] for c in comparisons if c["ratios"].get(key) is not None]
        report[key] = _judged(key, text, spread(values), percentile(values, 50))
    per_cell = spread([c["delivery_ms"]["p95"] for c in cells if c["delivery_ms"]["p95"] is not None])
    upper, lower = percentile(delivery[0], 95), percentile(delivery[1], 95)
    if mode == "websocket":  # the target is about the browser's socket, so it is judged there only
        text = (
            "token event stamped by the engine -> received over the WebSocket, p95 in ms "
            "(upper bound; lower bound beside it)"
        )
        report["delivery_p95_ms"] = _judged("delivery_p95_ms", text, per_cell, upper, lower)
    else:
        text = "token event stamped by the engine -> read by the in-process client thread, p95 in ms"
        report["delivery_p95_ms"] = _judged("", text, per_cell, upper, upper)
    return report


def _judged(key: str, text: str, values: dict, value: float | None, lower: float | None = None) -> dict:
    return judged(text, values, value, TARGETS.get(key), lower)


LABELS = {
    "queue_ms": "queue",
    "ttft_ms": "TTFT",
    "tpot_ms": "TPOT",
    "itl_ms": "ITL",
    "e2e_ms": "E2E",
    "delivery_ms": "delivery",
    "delivery_lower_ms": "deliv-lo",
}
RUNNERS = ("engine", "bare_loop", "generate_streamer")  # the sides of a comparison
PLOT_MISSING = (
    "--plot needs matplotlib, an optional extra: pip install 'kvscope[plot]' (or pip install matplotlib); "
    "the table and the JSON are complete without it"
)


def finish(report: dict, args: argparse.Namespace, started_at: datetime, out: TextIO | None = None) -> int:
    """Print, write, plot. Exit code 1 when a request ended in an error (the numbers are still written)."""
    out = out or sys.stdout
    code = floor.finish(report, args.json, started_at, print_report, out, SCHEMA, "bench")
    if args.plot:
        problem = plot(report, args.plot)
        print(f"kvscope bench: {problem}" if problem else f"wrote {args.plot}", file=sys.stderr if problem else out)
    return code


# ---- the tables ----------------------------------------------------------------------------------


def print_report(report: dict, out: TextIO) -> None:
    m, machine, ceil = report["model"], report["machine"], report["ceilings"]
    where = "in-process engine" if report["mode"] == "in-process" else f"over the WebSocket {report['url']}"
    load = machine.get("load_average_start")
    print(
        f"\nkvscope bench: {m['name']}, {m['params'] / 1e6:.1f}M parameters, {m['dtype']} on {m['device_name']}; "
        f"{where}",
        file=out,
    )
    print(
        f"machine: {machine['platform']}, {machine['cpu_count']} CPUs"
        + (f", load average {load[0]:.2f} at the start" if load else "")
        + f"; measured ceilings: copy {ceil['copy_gb_per_s']:.1f} GB/s (read+write), "
        f"matmul {ceil['matmul_gflop_per_s']:.1f} GFLOP/s"
        + (f" ({ceil['matmul']['what']})" if "matmul" in ceil else ""),  # the kernel the layers run
        file=out,
    )
    print(f"command: {report['command']}", file=out)
    print("\nDefinitions (as vLLM's `bench serve`; milliseconds, measured where the client reads events):", file=out)
    delivery = ("delivery_ms", "delivery_lower_ms") if report["mode"] == "websocket" else ("delivery_ms",)
    for key in (*METRICS, *delivery):
        print(f"  {LABELS[key]:8} {DEFINITIONS[key]}", file=out)
    _cells(report["cells"], delivery, out)
    if report["comparisons"]:
        _baselines(report["comparisons"], out)
    _ratios(report["ratios"], out)
    _estimates(report["cells"], out)
    if report["kv_cache_off"]:
        _cache_off(report["kv_cache_off"], out)
    floor.print_footer(report, out, reasons=True)


def _cells(cells: list[dict], delivery: tuple[str, ...], out: TextIO) -> None:
    print(
        "\nPer cell: distributions over completed requests (ITL pooled over their tokens); every request counted",
        file=out,
    )
    for c in cells:
        t = c["totals"]
        print(
            f"\nprompt {c['prompt_tokens']} tokens x up to {c['output_tokens_target']} out x {c['concurrency']} "
            f"client(s), {c['repeats']} repeat(s): {t['requests']} requests = {t['completed']} completed + "
            f"{t['timeouts']} timeouts + {t['cancelled']} cancelled + {t['errors']} errors; "
            f"{fmt_num(c['output_tokens']['mean'])} tokens out on average, {fmt_num(c['throughput_tokens_per_s'])} tokens/s",
            file=out,
        )
        print(f"  {'metric':8} {'n':>5} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}", file=out)
        for key in METRICS:
            d = c["metrics"][key]
            print(
                f"  {LABELS[key]:8} {d['n']:>5} {fmt_num(d['mean']):>9} {fmt_num(d['p50']):>9} {fmt_num(d['p90']):>9} "
                f"{fmt_num(d['p99']):>9}",
                file=out,
            )
        for key in delivery:
            d = c[key]
            print(
                f"  {LABELS[key]:8} {d['n']:>5} {fmt_num(d['mean'], 2):>9} {fmt_num(d['p50'], 2):>9} {fmt_num(d['p90'], 2):>9} "
                f"{fmt_num(d['p99'], 2):>9}",
                file=out,
            )


def _group(comparisons: list[dict]) -> dict[tuple[int, int], list[dict]]:
    groups: dict[tuple[int, int], list[dict]] = {}
    for c in comparisons:
        groups.setdefault((c["prompt_tokens"], c["output_tokens_target"]), []).append(c)
    return groups


def _median(rows: list[dict], runner: str, key: str) -> float | None:
    return percentile([r[runner][key] for r in rows if r[runner] and r[runner][key] is not None], 50)


def _spread(rows: list[dict], key: str) -> dict:
    values = [r["ratios"][key] for r in rows if r["ratios"].get(key) is not None]
    return {"median": percentile(values, 50), "min": min(values, default=None), "max": max(values, default=None)}


def _baselines(comparisons: list[dict], out: TextIO) -> None:
    print(
        "\nBaselines: same model object, prompt and machine, interleaved in each repeat "
        "(medians over repeats; ratios median [min-max])",
        file=out,
    )
    print(
        f"  {'prompt':>6} {'out':>5} {'reps':>4} | {'step ms: engine':>15} {'bare':>7} {'generate':>8} "
        f"{'engine/bare':>20} | {'tok/s: engine':>13} {'bare':>6} {'generate':>8} {'engine/generate':>20} | greedy",
        file=out,
    )
    for (p, o), rows in _group(comparisons).items():
        identical = {r["greedy_identical"] for r in rows}
        same = "identical" if identical == {True} else "DIFFERENT" if False in identical else "-"
        step, tps = ({n: fmt_num(_median(rows, n, key)) for n in RUNNERS} for key in ("step_ms_median", "tokens_per_s"))
        print(
            f"  {p:>6} {o:>5} {len(rows):>4} | {step['engine']:>15} {step['bare_loop']:>7} "
            f"{step['generate_streamer']:>8} {fmt_ratio(_spread(rows, 'engine_step_over_bare'), 3):>20} | "
            f"{tps['engine']:>13} {tps['bare_loop']:>6} {tps['generate_streamer']:>8} "
            f"{fmt_ratio(_spread(rows, 'engine_tps_over_generate')):>20} | {same}",
            file=out,
        )


def _ratios(ratios: dict, out: TextIO) -> None:
    print("\nRatios over every repeat: median [min-max], against the targets (benchmarks, not tests)", file=out)
    for key, r in ratios.items():
        s = r["spread"]
        if key == "delivery_p95_ms":
            bounds = f"{r['value_lower']:.2f}-" if r["value_lower"] != r["value"] else ""
            shown = "-" if r["value"] is None else f"{bounds}{r['value']:.2f} ms"
        else:
            shown = fmt_ratio(s, 3)
        undecided = "undecided" if r["target"] is not None and r["value"] is not None else ""
        print(f"  {r['what']:<92} {shown:>26} {floor.goal_text(r):>8} {floor.verdict_text(r, undecided)}", file=out)


def _estimates(cells: list[dict], out: TextIO) -> None:
    print(
        "\nEstimates (computed from measured medians and the model's shape): prefill FLOP/s = "
        "(2 x non-embedding params x T + attention) / prefill time; decode bandwidth = "
        "(weights + KV cache bytes at mid-answer) / engine step",
        file=out,
    )
    print(
        f"  {'prompt':>6} {'out':>5} {'conc':>4} | {'GFLOP/s':>8} {'of matmul':>9} | {'GB/s':>6} {'of copy':>8}",
        file=out,
    )
    for c in cells:
        e = c["estimates"]
        print(
            f"  {c['prompt_tokens']:>6} {c['output_tokens_target']:>5} {c['concurrency']:>4} | "
            f"{fmt_num(e['prefill_gflop_per_s']):>8} {_pct(e['prefill_fraction_of_matmul']):>9} | "
            f"{fmt_num(e['decode_gb_per_s'], 2):>6} {_pct(e['decode_fraction_of_copy']):>8}",
            file=out,
        )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _cache_off(probe: dict, out: TextIO) -> None:
    print(
        f"\nKV cache off: the same {probe['prompt_tokens']}-token prompt, the engine's model time per decode step",
        file=out,
    )
    for key, label in (("with_cache", "with the cache"), ("without_cache", "without it")):
        r = probe[key]
        print(
            f"  {label:15} step 1: {fmt_num(r['first_step_ms'])} ms -> step {len(r['step_ms'])}: "
            f"{fmt_num(r['last_step_ms'])} ms (x{fmt_num(r['growth'], 2)}), {r['outcome']}",
            file=out,
        )
    on, off = probe["with_cache"]["last_step_ms"], probe["without_cache"]["last_step_ms"]
    if on and off:
        print(
            f"  at the last step, without the cache each token costs {off / on:.1f}x as much: every step "
            "recomputes the whole sequence, a prefill per token",
            file=out,
        )
    print(f"  greedy output with and without the cache: {_cache_off_verdict(probe)}", file=out)


def _cache_off_verdict(probe: dict) -> str:
    if probe["greedy_identical"] is None:
        return "- (a run did not complete)"
    if probe["greedy_identical"]:
        return "identical"
    gap = probe.get("top_two_gap_there")
    where = f"parted at token {probe.get('first_difference')}"
    if gap is None:
        return f"{where} (no top-two gap was sent there)"
    return (
        f"{where}, where the top two were {gap:.3g} logits apart (each step without the cache is a whole-sequence "
        "forward, other sums, so only a near-tie may part: docs/reliability.md)"
    )


# ---- the plot ----------------------------------------------------------------------------------


def plot(report: dict, path: str) -> str | None:
    """TTFT p50 (bars to p90) against prompt length, one line per output length and concurrency;
    and the pooled ITL distribution of each cell. Returns a message when it cannot draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return PLOT_MISSING
    cells = report["cells"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    series: dict[tuple[int, int], list[dict]] = {}
    for c in cells:
        series.setdefault((c["output_tokens_target"], c["concurrency"]), []).append(c)
    for (o, conc), rows in sorted(series.items()):
        rows = [r for r in sorted(rows, key=lambda r: r["prompt_tokens"]) if r["metrics"]["ttft_ms"]["p50"] is not None]
        if not rows:
            continue
        x = [r["prompt_tokens"] for r in rows]
        p50 = [r["metrics"]["ttft_ms"]["p50"] for r in rows]
        up = [r["metrics"]["ttft_ms"]["p90"] - r["metrics"]["ttft_ms"]["p50"] for r in rows]
        left.errorbar(x, p50, yerr=[[0] * len(x), up], marker="o", capsize=3, label=f"out {o}, {conc} client(s)")
    lengths = sorted({c["prompt_tokens"] for c in cells})
    left.set(
        xscale="log",
        xlabel="prompt tokens (log scale)",
        ylabel="TTFT ms (p50, bar to p90)",
        title="Time to first token",
    )
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.minorticks_off()
    left.legend(fontsize=8)
    with_itl = [c for c in cells if c["requests"] and any(r["itl_ms"] for r in c["requests"])]
    data = [[x for r in c["requests"] if r["outcome"] == "completed" for x in r["itl_ms"]] for c in with_itl]
    keep = [(c, d) for c, d in zip(with_itl, data) if d]
    if keep:
        right.boxplot([d for _, d in keep], whis=(1, 99), showfliers=False)
        right.set_xticks(
            range(1, len(keep) + 1),
            [f"p{c['prompt_tokens']}\no{c['output_tokens_target']}\nx{c['concurrency']}" for c, _ in keep],
            fontsize=7,
        )
    right.set(ylabel="ITL ms (box p25-p75, whiskers p1-p99)", title="Inter-token latency per cell")
    m = report["model"]
    fig.suptitle(f"kvscope bench (measured): {m['name']}, {m['dtype']} on {m['device_name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
