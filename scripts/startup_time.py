"""How long `kvscope serve` takes to be ready, and to run its compiled decode stretches: starts the server as
`make run` does (the bundled model, `--compile on` unless told otherwise), reads `/api/model` every 0.1 s from
the moment it is started, and records when the model became ready and when `compiled` left `compiling`. With
`--fresh-compile` the compiled libraries' cache folder is emptied first (the first start after an upgrade); the
model's own converted copy stays where it is.

    .venv/bin/python scripts/startup_time.py [--fresh-compile] [--compile on] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import kernel_facts, load_average  # noqa: E402

PORT = 8791
LIMIT_S = 900.0


def model_state(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/api/model", timeout=5) as response:
            return json.loads(response.read())
    except OSError:
        return None  # not listening yet


def measure(compile_mode: str, port: int) -> dict:
    """Seconds from the start of `kvscope serve` to the model's readiness and to `compiled` settling."""
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "kvscope.cli", "serve", "--port", str(port), "--compile", compile_mode]
    start = time.monotonic()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times: dict = {"ready_s": None, "compiled_s": None, "compiled": None}
    try:
        while time.monotonic() - start < LIMIT_S:
            state = model_state(url)
            now = round(time.monotonic() - start, 1)
            if state and state["status"] == "ready" and times["ready_s"] is None:
                times["ready_s"] = now
            compiled = state and state.get("compiled")
            if compiled and compiled["state"] != "compiling":
                times["compiled_s"], times["compiled"] = now, compiled
                break
            if server.poll() is not None:
                raise SystemExit(f"kvscope serve exited {server.returncode} before it was ready and compiled")
            time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh-compile", action="store_true", help="empty the compiled libraries' cache first")
    parser.add_argument("--compile", default="on", choices=("auto", "on", "off"))
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from model_runner.loading.loader import cache_root

    if args.fresh_compile:
        shutil.rmtree(cache_root() / "compiled", ignore_errors=True)
    cache = cache_root()
    result = {
        "command": "scripts/startup_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **kernel_facts(),
        "load_average_before": load_average(),
        # what the start found: an empty cache is a first start (the GGUF converted, the libraries compiled)
        "cache_held": sorted(p.name for p in cache.iterdir()) if cache.is_dir() else [],
        **measure(args.compile, args.port),
        "load_average_after": load_average(),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
