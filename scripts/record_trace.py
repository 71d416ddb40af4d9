"""Records the walkthrough's example request with kvscope's own engine and writes it as a kvscope
trace (docs/trace-format.md), the file the page plays before any live run:

    .venv/bin/python scripts/record_trace.py                 # real default model → static/data/trace-example.json
    .venv/bin/python scripts/record_trace.py --model fake --out /tmp/t.json
    .venv/bin/python scripts/record_trace.py --no-attention  # without the `attention` events

With attention inspection on (the default, as the shipped trace is recorded) the request carries
`"inspect": {"attention": true}` and the trace an `attention` event before each `token`: what the
walkthrough's decode and cache stages show each new token read.

It runs on the route `--dtype auto` picks here (int4 on an AVX-512 CPU), and the trace names that route,
the machine and its `uptime` load (`recorded_on`), which the page shows beside the recorded run.

The format, the recorder and the validator live in `model_runner.protocol.trace`; this is the command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_runner.protocol.trace import EXAMPLE_REQUEST, dumps_trace, record, validate_trace, warm_up, with_attention  # noqa: E402
from scripts.record_serving_trace import decoder_words, machine_name  # noqa: E402

DEFAULT_OUT = ROOT / "static" / "data" / "trace-example.json"
RUN_LIMIT_S = 900.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help='"default" (SmolLM2-135M-Instruct), "fake", or a path')
    parser.add_argument("--dtype", default="auto", help="the weights' route (default: auto, as the server runs)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--attention",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record what each new token read from the cache (default: on, as the shipped trace)",
    )
    args = parser.parse_args(argv)

    from model_runner.local.engine import Engine, EngineConfig

    # a busy machine stretches the run; the recording must still be a whole answer, not a timeout
    engine = Engine(EngineConfig(model=args.model, dtype=args.dtype, timeout_s=RUN_LIMIT_S)).start()
    try:
        engine.wait_ready(600)
        request = with_attention(EXAMPLE_REQUEST) if args.attention else EXAMPLE_REQUEST
        warm_up(engine, request=request)
        trace = record(
            engine,
            request,
            note="Recorded with scripts/record_trace.py after one warm-up request; "
            "times are the recording machine's, measured by the engine.",
        )
        trace["recorded_on"]["decoder"] = decoder_words(engine.decoder())  # named in the page's source line
    finally:
        engine.shutdown()
    # the page names the recording machine: its processor's model, not only its architecture
    trace["recorded_on"]["machine"] = machine_name().rsplit(", ", 1)[0]  # the cores are its own field, cpus
    problems = validate_trace(trace)
    if problems:
        print("record_trace: the recorded trace is not valid: " + "; ".join(problems), file=sys.stderr)
        return 1
    last = trace["events"][-1]
    if last.get("reason") not in ("eos", "max_tokens", "stop"):
        print(
            f"record_trace: the run ended with {last.get('reason') or last.get('code')}; not written", file=sys.stderr
        )
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_trace(trace)
    args.out.write_text(text, encoding="utf-8")
    route = trace["recorded_on"]["route"]["dtype_route"]
    print(
        f"record_trace: {len(trace['events'])} events, {last.get('tokens')} tokens, "
        f"ended with {last.get('reason') or last.get('code')} on the {route} route, {trace['recorded_on']['uptime']} "
        f"→ {args.out} ({len(text.encode()) / 1e3:.0f} kB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
