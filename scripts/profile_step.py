"""Where a decode token's time goes: one greedy request on the bundled model (a ~64-token prompt), or
`--clients N` of them stepped together (N rows a decode step), the decode steps timed one by one on this
thread, then the same steps under torch's profiler, printed as the top ops by self CPU time with their calls a
step. Prints the CPU and torch's kernel capability with it, so a profile names the machine it describes
(docs/performance.md).

    .venv/bin/python scripts/profile_step.py [--dtype auto] [--decoder native] [--tokens 48] [--threads N]
        [--clients 1] [--decode-only]
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


def engine_for(dtype: str, decoder: str, compile: str = "off"):
    """The bundled model's engine on this route, its decode stretches compiled first where `compile` asks."""
    from model_runner.loading.loader import load
    from model_runner.local.engine import Engine, EngineConfig

    config = EngineConfig(model="default", device="cpu", dtype=dtype, timeout_s=600.0, decoder=decoder, compile=compile)
    engine = Engine(config, loaded=load("default", "cpu", dtype))
    if compile != "off" and engine.compiled(wait=True)["state"] != "on":
        raise SystemExit(f"the decode stretches did not compile: {engine.compiled()['reason']}")
    return engine


def decode_steps(
    engine, tokens: int, forwards: list | None = None, clients: int = 1, others: list | None = None, on_phase=None
) -> list[float]:
    """`clients` greedy requests (one prompt each, its first line their own) stepped together on this thread;
    → the wall time in ms of each decode step: a step in which every request, past its prompt, makes a token
    (so the prompts' steps are left out, and with several clients the steps after the first one ends).
    `forwards`, when given, gets the first request's token events' own step_ms in those steps; `others` the
    other steps' times; `on_phase("decode")` is called before the first decode step, `on_phase("end")` after
    the last."""
    import torch

    from model_runner.protocol.request import parse_generate

    words = "Explain, step by step and with an example, how a key-value cache speeds up a transformer. " * 4
    handles = []
    for client in range(clients):
        content = words if client == 0 else f"Reader {client} asks:\n{words}"
        body = {"messages": [{"role": "user", "content": content}], "max_new_tokens": tokens, "ignore_eos": True}
        handles.append(engine.submit(parse_generate(body)))  # each runs to `tokens`
    times, started, phase = [], set(), "prompt"
    with torch.inference_mode():
        while not all(handle.done for handle in handles):
            decoding = len(started) == clients and not any(handle.done for handle in handles)
            if (phase == "prompt" and decoding) or (phase == "decode" and not decoding):
                phase = "decode" if phase == "prompt" else "end"
                if on_phase is not None:
                    on_phase(phase)
            start = time.perf_counter()
            engine.step()
            elapsed = (time.perf_counter() - start) * 1000
            if decoding:
                times.append(elapsed)
            elif others is not None:
                others.append(elapsed)
            for client, handle in enumerate(handles):
                while (event := handle.next_event(timeout=0)) is not None:
                    body = event.to_dict()
                    if body.get("type") != "token":
                        continue
                    started.add(client)
                    if decoding and client == 0 and forwards is not None and "step_ms" in body:
                        forwards.append(body["step_ms"])
    if phase == "decode" and on_phase is not None:
        on_phase("end")
    if not times:
        raise SystemExit(f"no decode step: {clients} request(s) of {tokens} tokens never all made a token together")
    return times


def profile(engine, tokens: int, top: int, clients: int = 1, decode_only: bool = False) -> dict:
    """The steps of one run under torch's profiler: every op's self time and calls averaged over the profiled
    steps (the prompts' among them, unless `decode_only`: then the decode steps alone are profiled; see
    `decode_steps`)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    others: list[float] = []
    prof = torch_profile(activities=[ProfilerActivity.CPU])
    if decode_only:
        toggle = {"decode": prof.start, "end": prof.stop}
        steps = decode_steps(engine, tokens, clients=clients, others=others, on_phase=lambda phase: toggle[phase]())
    else:
        with prof:
            steps = decode_steps(engine, tokens, clients=clients, others=others)
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self = sum(e.self_cpu_time_total for e in averages) / 1000  # ms, every op's own time
    wall = sum(steps) + 0.0
    n = len(steps) + (0 if decode_only else len(others))  # the other steps, where they are profiled too
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
        "profiled_decode_steps": len(steps),
        "profiled_other_steps": 0 if decode_only else len(others),  # the prompts' (and, with clients, the last)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--decoder", default="native")
    parser.add_argument("--compile", default="off", choices=("off", "on"), help="the decode stretches compiled first")
    parser.add_argument("--tokens", type=int, default=48, help="tokens a request (2 or more: one decode step)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--clients", type=int, default=1, help="requests stepped together (their decode steps)")
    parser.add_argument("--decode-only", action="store_true", help="profile the decode steps alone, not the prompts'")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.clients < 1:
        parser.error(f"--tokens must be 2 or more (got {args.tokens}) and --clients 1 or more (got {args.clients})")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = engine_for(args.dtype, args.decoder, args.compile)
    decode_steps(engine, 8, clients=args.clients)  # warm: first calls allocate, pack and tune
    runs, forward_runs = [], []
    for _ in range(args.repeats):
        forwards: list[float] = []
        runs.append(statistics.median(decode_steps(engine, args.tokens, forwards, args.clients)))
        forward_runs.append(statistics.median(forwards) if forwards else float("nan"))
    result = {
        **kernel_facts(),
        "load_average": list(os.getloadavg()),
        "clients": args.clients,
        "route": f"{args.dtype}:{engine.decoder()['name'] if isinstance(engine.decoder(), dict) else engine.decoder()}",
        "compiled": engine.compiled(),
        "median_step_ms_per_repeat": [round(r, 2) for r in runs],  # engine.step(): schedule, forward, postprocess
        "median_forward_ms_per_repeat": [round(r, 2) for r in forward_runs],  # the token events' step_ms
        "profile": profile(engine, args.tokens, args.top, args.clients, args.decode_only),
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
