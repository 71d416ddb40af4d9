"""Where a lone decode token's time goes: one greedy request on the bundled model (a ~64-token prompt), its
decode steps timed one by one on this thread, then the same steps under torch's profiler, printed as the top ops
by self CPU time with their calls a step, and the host's share (a step's time outside every aten op). Prints the
CPU and torch's kernel capability with it, so a profile names the machine it describes (docs/performance.md).

    .venv/bin/python scripts/profile_step.py [--dtype auto] [--decoder native] [--tokens 48] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import kernel_facts  # noqa: E402


def engine_for(dtype: str, decoder: str):
    from model_runner.loading.loader import load
    from model_runner.local.engine import Engine, EngineConfig

    config = EngineConfig(model="default", device="cpu", dtype=dtype, timeout_s=600.0, decoder=decoder)
    return Engine(config, loaded=load("default", "cpu", dtype))


def decode_steps(engine, tokens: int, forwards: list | None = None) -> list[float]:
    """One greedy request stepped on this thread; → each decode step's wall time in ms (prefill left out).
    `forwards`, when given, gets each decode token event's own step_ms (the forward alone)."""
    import torch

    from model_runner.protocol.request import parse_generate

    words = "Explain, step by step and with an example, how a key-value cache speeds up a transformer. " * 4
    params = parse_generate({"messages": [{"role": "user", "content": words}], "max_new_tokens": tokens})
    handle = engine.submit(params)
    times, first = [], True
    with torch.inference_mode():
        while not handle.done:
            start = time.perf_counter()
            engine.step()
            elapsed = (time.perf_counter() - start) * 1000
            if not first:
                times.append(elapsed)
            while (event := handle.next_event(timeout=0)) is not None:
                body = event.to_dict()
                if not first and forwards is not None and body.get("type") == "token" and "step_ms" in body:
                    forwards.append(body["step_ms"])
            first = False
    return times


def profile(engine, tokens: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        steps = decode_steps(engine, tokens)
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self = sum(e.self_cpu_time_total for e in averages) / 1000  # ms, every op's own time
    wall = sum(steps) + 0.0
    n = len(steps) + 1  # the prefill step is under the profiler too
    ops = [
        {
            "op": e.key,
            "self_ms_per_step": round(e.self_cpu_time_total / 1000 / n, 3),
            "calls_per_step": round(e.count / n, 1),
            "share": round(e.self_cpu_time_total / 1000 / total_self, 3),
        }
        for e in rows[:top]
    ]
    calls = sum(e.count for e in averages if e.key.startswith("aten::")) / n
    return {
        "ops": ops,
        "aten_calls_per_step": round(calls),
        "profiled_step_ms": round(statistics.median(steps), 2),
        "profiled_wall_ms": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--decoder", default="native")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = engine_for(args.dtype, args.decoder)
    decode_steps(engine, 8)  # warm: first calls allocate, pack and tune
    runs, forward_runs = [], []
    for _ in range(args.repeats):
        forwards: list[float] = []
        runs.append(statistics.median(decode_steps(engine, args.tokens, forwards)))
        forward_runs.append(statistics.median(forwards) if forwards else float("nan"))
    result = {
        **kernel_facts(),
        "load_average": list(os.getloadavg()),
        "route": f"{args.dtype}:{engine.decoder()['name'] if isinstance(engine.decoder(), dict) else engine.decoder()}",
        "median_step_ms_per_repeat": [round(r, 2) for r in runs],  # engine.step(): schedule, forward, postprocess
        "median_forward_ms_per_repeat": [round(r, 2) for r in forward_runs],  # the token events' step_ms
        "profile": profile(engine, args.tokens, args.top),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}, indent=1))
    prof = result["profile"]
    print(f"profiled: median step {prof['profiled_step_ms']} ms, {prof['aten_calls_per_step']} aten calls a step")
    for op in prof["ops"]:
        print(f"  {op['self_ms_per_step']:8.3f} ms  {op['calls_per_step']:7.1f} calls  {op['share']:6.1%}  {op['op']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
