"""Regional compilation measured against the eager native step: a decode layer's two stretches around attention
(native.before_attention and after_attention: the norms, rotary embedding, residuals and SiLU gate between the
int4 kernels) compiled once each by torch.compile and reused by every layer, and with `--aot` also compiled ahead
of time by AOTInductor into C++ libraries as `kvscope serve --compile` builds them (no Python between their
kernels; `--only-aot`: that one alone), the KV writes and attention left eager. Each variant and the eager step
run the same greedy request in one process, in interleaved rounds → each one's median forward ms and ratio to
eager, its warm-up seconds (the first variant's a compile in a fresh inductor cache, which the later ones share),
how many graphs it compiled, whether its stretches give eager's bits on one decode step's inputs to the first
layer, and whether its greedy answer to one prompt is eager's.

    .venv/bin/python scripts/compile_probe.py [--rounds 6] [--tokens 24] [--threads N] [--aot | --only-aot]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import kernel_facts, load_average  # noqa: E402
from scripts.profile_step import decode_steps, engine_for  # noqa: E402

# (name, inductor options) of each compiled variant; eager is the baseline
VARIANTS = (
    ("inductor", {}),
    ("inductor, C++ wrapper", {"cpp_wrapper": True}),
    ("inductor, one thread a kernel", {"cpp.threads": 1}),
)
AOT = "AOTInductor (--compile)"  # the engine's own compiled stretches (with --aot)
EAGER = "eager"


def native_of(engine):
    """The engine's native step (model_runner/local/model/native.py NativeLlama)."""
    from model_runner.local.model.native import NativeLlama

    decoder = engine._forward.decoder  # the engine's batched forward, built once the model is loaded
    if not isinstance(decoder, NativeLlama):
        raise SystemExit("this probe needs the native step (--decoder native on a Llama-family model)")
    return decoder


def compiled(options: dict, backend: str = "inductor") -> tuple:
    """(before_attention, after_attention) compiled with these inductor options, one graph each for every layer:
    the stretches take a layer's weights as arguments (guarded by shape and dtype), not as constants."""
    import torch

    from model_runner.local.model import native

    def compile_(fn):
        kwargs = {"options": options} if backend == "inductor" else {}
        return torch.compile(fn, backend=backend, dynamic=False, fullgraph=True, **kwargs)

    return compile_(native.before_attention), compile_(native.after_attention)


def aot_compiled(decoder, folder: str) -> tuple:
    """(before_attention, after_attention) as `--compile` runs them (model_runner/local/model/compiled.py): exported
    with the rows dynamic and compiled ahead of time by AOTInductor into C++ libraries under `folder`."""
    from model_runner.local.model import compiled as aot

    spec, why = aot.spec_of(decoder)
    if spec is None:
        raise SystemExit(f"no library to compile: {why}")
    aot.build(spec, Path(folder))
    return aot.load(Path(folder))


def use(decoder, stretches: tuple) -> None:
    decoder.stretches = stretches


def captured_inputs(engine, decoder) -> tuple[tuple, tuple]:
    """The arguments the first layer's two stretches got in one eager decode step of a new request."""
    eager = decoder.stretches
    seen: dict[str, tuple] = {}

    def recorder(name, fn):
        def record(*args):
            seen.setdefault(name, args)
            return fn(*args)

        return record

    use(decoder, (recorder("before", eager[0]), recorder("after", eager[1])))
    try:
        decode_steps(engine, 2)
    finally:
        use(decoder, eager)
    return seen["before"], seen["after"]


def same_bits(eager: tuple, candidate: tuple, inputs: tuple[tuple, tuple]) -> dict:
    """Each stretch's output on `inputs` by `candidate` against eager's: equal bits, or the largest difference."""
    import torch

    report = {}
    for name, mine, theirs, args in zip(("before_attention", "after_attention"), candidate, eager, inputs):
        with torch.inference_mode():  # as the step runs them (the norms' weights are parameters)
            a, b = torch.utils._pytree.tree_leaves(mine(*args)), torch.utils._pytree.tree_leaves(theirs(*args))
        equal = all(torch.equal(x, y) for x, y in zip(a, b))
        report[name] = "same bits" if equal else max(float((x - y).abs().max()) for x, y in zip(a, b))
    return report


def answer(engine, tokens: int) -> list[str]:
    """The greedy answer's token texts to a fixed question."""
    import torch

    from model_runner.protocol.request import parse_generate

    question = "Write a short story about a lighthouse keeper."
    params = parse_generate({"messages": [{"role": "user", "content": question}], "max_new_tokens": tokens})
    handle, texts = engine.submit(params), []
    with torch.inference_mode():
        while not handle.done:
            engine.step()
            while (event := handle.next_event(timeout=0)) is not None:
                body = event.to_dict()
                if body.get("type") == "token":
                    texts.append(body.get("text", ""))
    return texts


def probe(
    engine, rounds: int, tokens: int, variants=VARIANTS, backend: str = "inductor", aot_folder: str | None = None
) -> list[dict]:
    import torch
    from torch._dynamo.utils import counters

    decoder = native_of(engine)
    eager = decoder.stretches
    inputs = captured_inputs(engine, decoder)
    reference = answer(engine, tokens)
    rows = {EAGER: {"variant": EAGER, "options": None, "warm_s": 0.0, "graphs": 0}}
    stretches = {EAGER: eager}
    torch._dynamo.reset()  # once: a reset between variants would drop the earlier ones' compiled code
    for name, options in (*variants, *([(AOT, {})] if aot_folder else [])):
        graphs, start = counters["stats"]["unique_graphs"], time.perf_counter()
        if name == AOT:  # compiled here, before any step
            stretches[name] = aot_compiled(decoder, aot_folder)
        else:  # compiled by the first step that calls them
            stretches[name] = compiled(options, backend)
        use(decoder, stretches[name])
        decode_steps(engine, 2)
        rows[name] = {"variant": name, "options": options, "warm_s": round(time.perf_counter() - start, 1)}
        rows[name]["graphs"] = counters["stats"]["unique_graphs"] - graphs  # 2 when every layer reuses the two
        rows[name]["stretches_vs_eager"] = same_bits(eager, stretches[name], inputs)
        rows[name]["same_answer_as_eager"] = answer(engine, tokens) == reference
        use(decoder, eager)
    times: dict[str, list[float]] = {name: [] for name in stretches}
    for _ in range(rounds):
        for name, pair in stretches.items():
            use(decoder, pair)
            forwards: list[float] = []
            decode_steps(engine, tokens, forwards)
            times[name].append(statistics.median(forwards))
    use(decoder, eager)
    base = statistics.median(times[EAGER])
    for name, row in rows.items():
        row["forward_ms"] = round(statistics.median(times[name]), 2)
        row["forward_ms_per_round"] = [round(t, 2) for t in times[name]]
        row["vs_eager"] = round(statistics.median(times[name]) / base, 3)
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--aot", action="store_true", help="also the stretches exported and compiled by AOTInductor")
    parser.add_argument("--only-aot", action="store_true", help="AOTInductor alone beside eager (implies --aot)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    # a fresh inductor cache, so the first variant's warm-up is its compile, not a load of an earlier run's (the
    # later variants share it: theirs may be shorter than a cold compile)
    cache = tempfile.mkdtemp(prefix="kvscope-compile-probe-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = engine_for("auto", "native")
    decode_steps(engine, 8)  # warm: first calls allocate, pack and tune
    result = {
        "command": "scripts/compile_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **kernel_facts(),
        "load_average_before": load_average(),
        "variants": probe(
            engine,
            args.rounds,
            args.tokens,
            variants=() if args.only_aot else VARIANTS,
            aot_folder=cache if args.aot or args.only_aot else None,
        ),
        "load_average_after": load_average(),
    }
    for row in result["variants"]:
        bits = row.get("stretches_vs_eager", "")
        print(
            f"  {row['variant']:>30}  {row['forward_ms']:7.2f} ms  {row['vs_eager']:5.3f}x  warm {row['warm_s']} s  {bits}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
