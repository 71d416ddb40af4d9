"""Records the walkthrough's example request with kvscope's own engine and writes it as a kvscope
trace (docs/trace-format.md), the file the page plays before any live run:

    .venv/bin/python scripts/record_trace.py                 # real default model → static/data/trace-example.json
    .venv/bin/python scripts/record_trace.py --model fake --out /tmp/t.json

It runs on the route `--dtype auto` picks here (int4 on an AVX-512 CPU), and the trace names that route,
the machine and its `uptime` load (`recorded_on`), which the page shows beside the recorded run.

The format, the recorder and the validator live in `model_runner.trace`; this is the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_runner.trace import record, validate_trace, warm_up  # noqa: E402

DEFAULT_OUT = ROOT / "static" / "data" / "trace-example.json"
RUN_LIMIT_S = 900.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help='"default" (SmolLM2-135M-Instruct), "fake", or a path')
    parser.add_argument("--dtype", default="auto", help="the weights' route (default: auto, as the server runs)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    from model_runner.core.engine import Engine, EngineConfig

    # a busy machine stretches the run; the recording must still be a whole answer, not a timeout
    engine = Engine(EngineConfig(model=args.model, dtype=args.dtype, timeout_s=RUN_LIMIT_S)).start()
    try:
        engine.wait_ready(600)
        warm_up(engine)
        trace = record(
            engine,
            note="Recorded with scripts/record_trace.py after one warm-up request; "
            "times are this machine's, measured by the engine.",
        )
    finally:
        engine.shutdown()
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
    args.out.write_text(json.dumps(trace, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    route = trace["recorded_on"]["route"]["dtype_route"]
    print(
        f"record_trace: {len(trace['events'])} events, {last.get('tokens')} tokens, "
        f"ended with {last.get('reason') or last.get('code')} on the {route} route, {trace['recorded_on']['uptime']} "
        f"→ {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
