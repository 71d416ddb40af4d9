"""The step of several prompts arriving together, their attention packed against apart: `--clients N` prompts of
about `--prompt-tokens` tokens each, submitted at once and run to their first token, in interleaved rounds in one
process — once with every step packed and once with every step of two or more rows apart (each prompt over its
own keys), whatever the engine's rule says — so the machine's drift favours neither. → each mode's median time
for the prompts' steps (the engine's step(): schedule, forward, postprocess), their ratio, what the rule
(`rows_apart_pay`) chose for each step, whether the first tokens agree, and the machine's facts
(docs/performance.md).

    .venv/bin/python scripts/prompt_step_probe.py [--model default] [--clients 8] [--prompt-tokens 64] [--rounds 9]
        [--threads N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import kernel_facts, load_average  # noqa: E402

MODES = ("packed", "apart")


def forced(mode: str, chosen: list[bool]):
    """The rule the probe runs in `mode`: never apart ("packed") or apart wherever the rows may go apart at all
    (paged_step.rows_may_go_apart: "apart"); each step's own rule's choice goes to `chosen`."""
    from model_runner.local.model.paged_step import rows_apart_pay, rows_may_go_apart

    seen = []  # the step last asked about: the engine asks twice a step (its mask, then its run)

    def rule(step) -> bool:
        if not seen or seen[-1] is not step:
            seen[:] = [step]
            chosen.append(rows_apart_pay(step))
        return mode == "apart" and rows_may_go_apart(step)

    return rule


def prompts_step(engine, bodies: list[dict], mode: str) -> tuple[float, list[bool], list[int]]:
    """The bodies submitted at once and stepped on this thread until each has its first token, every step's
    attention as `mode` forces it → (ms in those steps, the engine's rule's choice at each step, each request's
    first token)."""
    import torch

    from model_runner.local.model import native
    from model_runner.protocol.request import parse_generate

    previous, chosen = native.rows_apart_pay, []
    native.rows_apart_pay = forced(mode, chosen)
    handles = [engine.submit(parse_generate(body)) for body in bodies]
    firsts: dict[int, int] = {}
    elapsed = 0.0
    try:
        with torch.inference_mode():
            while not all(handle.done for handle in handles):
                start = time.perf_counter()
                if not engine.step():
                    raise RuntimeError("the engine had nothing to step before every prompt had its first token")
                elapsed += (time.perf_counter() - start) * 1000
                for i, handle in enumerate(handles):
                    while (event := handle.next_event(timeout=0)) is not None:
                        body = event.to_dict()
                        if body.get("type") == "token":
                            firsts.setdefault(i, body["id"])
    finally:
        native.rows_apart_pay = previous
    if len(firsts) < len(bodies):
        raise RuntimeError(f"{len(bodies) - len(firsts)} of {len(bodies)} prompts ended without a first token")
    return elapsed, chosen, [firsts[i] for i in range(len(bodies))]


def probe(engine, clients: int, prompt_tokens: int, rounds: int) -> dict:
    from bench.measure import fit_prompt

    prompts = [fit_prompt(engine.describe_prompt, prompt_tokens, variant=i) for i in range(clients)]
    bodies = [{"messages": p.messages, "max_new_tokens": 1} for p in prompts]
    for mode in MODES:  # warm: first calls allocate and tune
        prompts_step(engine, bodies, mode)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    choices: dict[str, set[tuple[bool, ...]]] = {mode: set() for mode in MODES}
    firsts: dict[str, list[int]] = {}
    for round_ in range(rounds):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            ms, chosen, tokens = prompts_step(engine, bodies, mode)
            times[mode].append(round(ms, 2))
            choices[mode].add(tuple(chosen))
            firsts[mode] = tokens
    packed, apart = (statistics.median(times[mode]) for mode in MODES)
    return {
        "clients": clients,
        "prompt_tokens": [p.tokens for p in prompts],
        "steps": {mode: sorted(len(c) for c in choices[mode]) for mode in MODES},
        # what the engine's own rule chose at each step, the same in every round and mode (the same steps)
        "rule_apart": [list(c) for c in sorted(choices["packed"] | choices["apart"])],
        "ms_per_round": times,
        "median_ms": {"packed": round(packed, 2), "apart": round(apart, 2)},
        "apart_over_packed": round(apart / packed, 3),
        "apart_faster_rounds": sum(a < p for a, p in zip(times["apart"], times["packed"])),
        "same_first_tokens": firsts["apart"] == firsts["packed"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.clients < 2 or args.rounds < 1:
        parser.error(f"--clients must be 2 or more (got {args.clients}) and --rounds 1 or more (got {args.rounds})")

    import torch

    from model_runner.loading.loader import load
    from model_runner.local.engine import Engine, EngineConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    config = EngineConfig(model=args.model, device="cpu", dtype="auto", timeout_s=600.0, decoder="native")
    engine = Engine(config, loaded=load(args.model, "cpu", "auto"))
    command = "python scripts/prompt_step_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {"command": command, "model": args.model, "route": engine.loaded.facts.dtype_route, **kernel_facts()}
    result["load_average_before"] = load_average()
    result |= probe(engine, args.clients, args.prompt_tokens, args.rounds)
    result["load_average_after"] = load_average()
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
