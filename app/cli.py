"""The `kvscope` command: `serve` runs the page and the model under gunicorn (one worker, since the
model lives in the process; gthread threads, one per open WebSocket), `bench` measures the phases."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from bench.runner import add_parser as add_bench_parser
from model_runner import config as engine_defaults
from model_runner import loader
from model_runner.errors import UserError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def policy_of(args: argparse.Namespace) -> dict:
    """The policy the server starts with: KVSCOPE_POLICY from the environment, then the flags given
    on top of it; checked here, so a bad value stops in one line before the server starts."""
    raw = os.environ.get("KVSCOPE_POLICY") or "{}"
    try:
        policy = json.loads(raw)
    except ValueError:
        raise UserError(f"KVSCOPE_POLICY must be a JSON object, got {raw[:60]!r}", field="policy") from None
    if not isinstance(policy, dict):
        raise UserError(f"KVSCOPE_POLICY must be a JSON object, got {raw[:60]!r}", field="policy")
    flags = {"max_num_seqs": args.max_num_seqs, "batching": args.batching, "prefix_caching": args.prefix_caching}
    policy.update({name: value for name, value in flags.items() if value is not None})
    if args.chunked_prefill is not None:  # 0 turns chunking off
        policy.update(chunked_prefill=args.chunked_prefill > 0)
        if args.chunked_prefill > 0:
            policy["chunk_size"] = args.chunked_prefill
    engine_defaults.POLICY.updated(policy)
    return policy


def serve(args: argparse.Namespace) -> int:
    from gunicorn.app.base import BaseApplication

    loader.preflight(args.model, args.device, args.dtype)
    policy = policy_of(args)
    if args.kv_cache_mb is not None and args.kv_cache_mb <= 0:
        raise UserError(
            f"--kv-cache-mb must be a positive number of MiB, got {args.kv_cache_mb:g}", field="kv_cache_mb"
        )
    config = {
        "MODEL": args.model,
        "DEVICE": args.device,
        "DTYPE": args.dtype,
        "BIND_HOST": args.host,
        "PORT": args.port,
        "ALLOWED_ORIGINS": args.allow_origin or [],
        "TIMEOUT_S": args.timeout,
        # Each open WebSocket holds a thread: keep some free for page and API requests.
        "MAX_SOCKETS": max(1, args.threads - 32),
    }
    # Flags given on the command line win; the others leave the KVSCOPE_* environment and defaults alone.
    given = {"MAX_QUEUE": args.max_queue, "KV_CACHE_MB": args.kv_cache_mb, "POLICY": policy or None}
    config.update({key: value for key, value in given.items() if value is not None})

    class KvscopeServer(BaseApplication):
        def load_config(self):
            host = f"[{args.host}]" if ":" in args.host else args.host
            for key, value in {
                "bind": f"{host}:{args.port}",
                "workers": 1,
                "worker_class": "gthread",
                "threads": args.threads,
                "timeout": 0,
                "graceful_timeout": 5,
                "accesslog": None,
                "loglevel": "warning",
            }.items():
                self.cfg.set(key, value)

        def load(self):
            from app import create_app

            return create_app(config)

    if args.host not in LOOPBACK:
        print(
            f"kvscope: WARNING: listening on {args.host}: anyone who can reach this machine on port {args.port} "
            "can use the page and the model. Use it on a classroom network you trust.",
            file=sys.stderr,
        )
    print(
        f"kvscope: serving on http://{'localhost' if args.host in LOOPBACK else args.host}:{args.port}/ "
        f"(model {args.model}, device {args.device}, dtype {args.dtype}); the page works while the model loads",
        flush=True,
    )
    KvscopeServer().run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscope", description="Inside a streaming answer: a real model, measured.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the page and the model")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 for a classroom)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--model",
        default="default",
        help="'default' (bundled SmolLM2-135M-Instruct), a local transformers folder, or a hub id in your cache",
    )
    s.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    s.add_argument("--dtype", default="auto", help="auto (bf16/fp16 on GPU, fp32 on CPU), float32, bfloat16 or float16")
    s.add_argument("--threads", type=int, default=128, help="gunicorn threads: one per open WebSocket")
    s.add_argument(
        "--timeout",
        type=float,
        default=engine_defaults.TIMEOUT_S,
        help=f"server-side limit per request, seconds (default {engine_defaults.TIMEOUT_S:g})",
    )
    s.add_argument(
        "--max-queue",
        type=int,
        help=f"requests that may wait at once; more are answered 'overloaded' (default {engine_defaults.MAX_QUEUE})",
    )
    default = engine_defaults.POLICY
    s.add_argument(
        "--max-num-seqs",
        type=int,
        metavar="N",
        help=f"requests in the running batch at once; 1 = one at a time (default {default.max_num_seqs})",
    )
    s.add_argument(
        "--batching",
        choices=("continuous", "static"),
        help=f"continuous: admit whenever a place frees; static: when the batch has finished (default {default.batching})",
    )
    s.add_argument(
        "--chunked-prefill",
        type=int,
        metavar="TOKENS",
        help="split prompts into chunks of this many tokens that share steps with decodes (default off)",
    )
    s.add_argument(
        "--prefix-caching",
        action="store_const",
        const=True,
        help="share the KV blocks of identical prompt prefixes between requests (default off)",
    )
    s.add_argument(
        "--kv-cache-mb",
        type=float,
        default=None,
        metavar="MIB",
        help="size of the paged KV cache pool in MiB (default: room for one full context window, at least 4,096 positions)",
    )
    s.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="extra Origin allowed to open the WebSocket (repeatable); same origin is always allowed",
    )
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
