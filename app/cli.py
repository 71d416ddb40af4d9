"""The `kvscope` command: `serve` runs the page and the model under gunicorn (one worker, since the
model lives in the process; gthread threads, one per open WebSocket), `bench` measures the phases."""
from __future__ import annotations

import argparse
import logging
import sys

from bench.runner import add_parser as add_bench_parser
from model_runner.errors import UserError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _preflight(model: str, device: str, dtype: str) -> None:
    """Fail fast, in one line, on what can be checked before the server starts."""
    from model_runner import loader
    if model == "fake" or model.startswith("fake:"):
        return
    torch_device = loader.resolve_device(device)
    loader.resolve_dtype(dtype, torch_device)
    if model == "default":
        loader.find_default_gguf()
        return
    from pathlib import Path
    if model.startswith((".", "/", "~")) and not Path(model).expanduser().exists():
        raise UserError(f"--model {model}: no such file or folder; pass a transformers model folder, a hub id "
                        "you have cached, or leave --model out for the bundled SmolLM2", field="model")
    if Path(model).expanduser().is_dir():
        from transformers import AutoTokenizer
        try:
            tok = AutoTokenizer.from_pretrained(str(Path(model).expanduser()))
        except (OSError, ValueError) as exc:
            raise UserError(f"--model {model}: no tokenizer could be loaded from it ({str(exc).splitlines()[0]})",
                            field="model") from None
        if not getattr(tok, "chat_template", None):
            raise UserError(f"--model {model}: its tokenizer has no chat template, so chat messages cannot be "
                            "rendered; use an instruct/chat model", field="model")


def serve(args: argparse.Namespace) -> int:
    from gunicorn.app.base import BaseApplication

    _preflight(args.model, args.device, args.dtype)
    config = {"MODEL": args.model, "DEVICE": args.device, "DTYPE": args.dtype, "BIND_HOST": args.host,
              "PORT": args.port, "ALLOWED_ORIGINS": args.allow_origin or [], "TIMEOUT_S": args.timeout,
              # Each open WebSocket holds a thread: keep some free for page and API requests.
              "MAX_SOCKETS": max(1, args.threads - 32)}

    class KvscopeServer(BaseApplication):
        def load_config(self):
            host = f"[{args.host}]" if ":" in args.host else args.host
            for key, value in {"bind": f"{host}:{args.port}", "workers": 1, "worker_class": "gthread",
                               "threads": args.threads, "timeout": 0, "graceful_timeout": 5,
                               "accesslog": None, "loglevel": "warning"}.items():
                self.cfg.set(key, value)

        def load(self):
            from app import create_app
            return create_app(config)

    if args.host not in LOOPBACK:
        print(f"kvscope: WARNING: listening on {args.host}: anyone who can reach this machine on port {args.port} "
              "can use the page and the model. Use it on a classroom network you trust.", file=sys.stderr)
    print(f"kvscope: serving on http://{'localhost' if args.host in LOOPBACK else args.host}:{args.port}/ "
          f"(model {args.model}, device {args.device}, dtype {args.dtype}); the page works while the model loads",
          flush=True)
    KvscopeServer().run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscope", description="Inside a streaming answer: a real model, measured.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the page and the model")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 for a classroom)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", default="default",
                   help="'default' (bundled SmolLM2-135M-Instruct), a local transformers folder, or a hub id in your cache")
    s.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    s.add_argument("--dtype", default="auto", help="auto (bf16/fp16 on GPU, fp32 on CPU), float32, bfloat16 or float16")
    s.add_argument("--threads", type=int, default=128, help="gunicorn threads: one per open WebSocket")
    s.add_argument("--timeout", type=float, default=120.0, help="server-side limit per request, seconds")
    s.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                   help="extra Origin allowed to open the WebSocket (repeatable); same origin is always allowed")
    s.set_defaults(func=serve)
    add_bench_parser(sub)  # a broken import fails loudly here, never hides the subcommand
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="kvscope: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"kvscope: error: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
