"""The `kvscope` command: `serve` runs the page and the model under gunicorn (one worker, since the
model lives in the process; gthread threads, one per open WebSocket), `bench` measures the phases."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from app.classroom.start import class_policy, class_setup
from bench.class_sim import add_parser as add_class_sim_parser
from bench.runner import add_parser as add_bench_parser
from model_runner.loading import loader
from model_runner.local import config as engine_defaults
from model_runner.protocol.errors import UserError

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

    # --class listens on every interface unless --host says otherwise; without it, loopback.
    args.host = args.host or ("0.0.0.0" if args.class_mode else "127.0.0.1")
    remote = remote_engine_of(args)  # --engine openai:URL: a remote server instead of the built-in model
    if remote is None:
        loader.preflight(args.model, args.device, args.dtype)
    policy = policy_of(args)
    if args.class_mode and remote is None:  # a class's own defaults (app/classroom/start.py) under env and flags
        policy = class_policy(policy)
    if args.batch_invariant:
        policy = batch_invariant_policy(args, policy, remote)
    if remote is not None and args.decoder != "auto":
        raise UserError("--decoder chooses the built-in engine's decoder, not --engine's", field="decoder")
    if remote is not None and args.compile is not None:
        raise UserError("--compile compiles the built-in engine's step, not --engine's", field="compile")
    if args.kv_cache_mb is not None and args.kv_cache_mb <= 0:
        raise UserError(
            f"--kv-cache-mb must be a positive number of MiB, got {args.kv_cache_mb:g}", field="kv_cache_mb"
        )
    config = {
        "MODEL": args.model,
        "DEVICE": args.device,
        "DTYPE": args.dtype,
        "CUDA_GRAPHS": args.cuda_graphs,
        "DECODER": args.decoder,
        "BIND_HOST": args.host,
        "PORT": args.port,
        "ALLOWED_ORIGINS": args.allow_origin or [],
        "TIMEOUT_S": args.timeout,
        # Each open WebSocket holds a thread: keep some free for page and API requests.
        "MAX_SOCKETS": max(1, args.threads - 32),
    }
    # Flags given on the command line win; the others leave the KVSCOPE_* environment and defaults alone.
    given = {"MAX_QUEUE": args.max_queue, "KV_CACHE_MB": args.kv_cache_mb, "POLICY": policy or None}
    given["COMPILE"] = args.compile
    if args.draft_model:  # the speculative experiment's draft model: checked now, loaded on first use
        loader.preflight(args.draft_model, args.device, args.dtype)
        given["DRAFT_MODEL"] = args.draft_model
    config.update({key: value for key, value in given.items() if value is not None})
    config.update(remote or {})
    if args.served_model_name:  # the ids /v1 answers to besides the model's own; the first is reported
        config["SERVED_MODEL_NAMES"] = args.served_model_name
    api_key = args.api_key or os.environ.get("KVSCOPE_API_KEY") or None
    if api_key:
        config["API_KEY"] = api_key  # a string even when it looks like JSON (from_prefixed_env would parse it)
    class_lines = []
    if args.class_mode:
        class_config, class_lines = class_setup(args.host, args.port, args.class_host, None if remote else policy)
        config.update(class_config)

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

    for line in class_lines:  # the join URL, the teacher URL and who can now reach the model
        print(line, file=sys.stderr if "WARNING" in line else sys.stdout, flush=True)
    if args.host not in LOOPBACK and not class_lines:
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
    for line in engine_lines(args, remote, api_key):
        print(line, file=sys.stderr if "WARNING" in line else sys.stdout, flush=True)
    KvscopeServer().run()
    return 0


def remote_engine_of(args: argparse.Namespace) -> dict | None:
    """The app config for --engine openai:URL (checked here: a bad URL stops in one line), or None."""
    if not args.engine:
        if args.engine_model or args.engine_config:
            raise UserError("--engine-model and --engine-config need --engine openai:URL", field="engine")
        return None
    from model_runner.remote.facts import config_path
    from model_runner.remote.http import parse_url

    parse_url(args.engine)
    config_path(args.engine_config)
    if not 0 <= args.engine_top_logprobs <= 5:
        raise UserError(f"--engine-top-logprobs must be 0 to 5, got {args.engine_top_logprobs}", field="engine")
    return {
        "ENGINE_URL": args.engine,
        "ENGINE_MODEL": args.engine_model,
        "ENGINE_CONFIG": args.engine_config,
        "ENGINE_TOP_LOGPROBS": args.engine_top_logprobs,
    }


def engine_lines(args: argparse.Namespace, remote: dict | None, api_key: str | None) -> list[str]:
    """What the start-up output says about a remote engine and the /v1 API key (never the key itself)."""
    lines = []
    if remote:
        lines.append(
            f"kvscope: the model runs on the remote server {args.engine} ({args.engine_model or 'the first model it lists'}); "
            "the page shows what is visible from outside it (see docs/scale.md)"
        )
    if api_key:
        lines.append(
            "kvscope: /v1/* requires `Authorization: Bearer <API key>` (the key from --api-key or KVSCOPE_API_KEY)"
        )
    elif args.host not in LOOPBACK:
        lines.append(
            f"kvscope: WARNING: /v1/* (the OpenAI-compatible API) is open to anyone who can reach {args.host}:{args.port}; "
            "set --api-key or KVSCOPE_API_KEY to require a key"
        )
    return lines


def batch_invariant_policy(args: argparse.Namespace, policy: dict, remote: dict | None) -> dict:
    """--batch-invariant: the policy's `batch_invariant`, whose check refuses it beside prefix caching asked
    for (--prefix-caching); a class's default prefix caching yields to it. Refused with --engine (that
    server batches)."""
    if remote is not None:
        raise UserError("--batch-invariant is a mode of the built-in engine, not of --engine", field="batch_invariant")
    policy = {**policy, "batch_invariant": True}
    if not args.prefix_caching:
        policy["prefix_caching"] = False
    engine_defaults.POLICY.updated(policy)
    return policy


def add_batch_invariant_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="a request's logits are the same bits whatever else is served: decode steps padded to --max-num-seqs "
        "rows, prompts prefilled alone, prefix caching off; slower (docs/reliability.md)",
    )


def add_step_flags(parser: argparse.ArgumentParser) -> None:
    """--decoder, and --compile (the native step's decode stretches compiled ahead of time) beside it; --compile
    leaves KVSCOPE_COMPILE and the app's default (auto) alone unless given."""
    parser.add_argument(
        "--decoder",
        choices=engine_defaults.DECODERS,
        default="auto",
        help=engine_defaults.DECODER_HELP + " (default auto)",
    )
    parser.add_argument(
        "--compile",
        choices=engine_defaults.COMPILE,
        default=None,
        help=engine_defaults.COMPILE_HELP + " (default auto, or KVSCOPE_COMPILE)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscope", description="Inside a streaming answer: a real model, measured.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the page and the model")
    s.add_argument("--host", help="address to bind (default loopback; with --class every interface, 0.0.0.0)")
    s.add_argument(
        "--class",
        dest="class_mode",
        action="store_true",
        help="classroom mode: students join over the LAN, the teacher projects /class (see docs/classroom.md)",
    )
    s.add_argument(
        "--class-host",
        action="append",
        metavar="NAME",
        help="with --class: another host name students may use (repeatable); the LAN address and hostname always work",
    )
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--model",
        default="default",
        help="'default' (bundled SmolLM2-135M-Instruct), a local transformers folder, or a hub id in your cache",
    )
    s.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    s.add_argument("--dtype", default="auto", help=loader.DTYPE_HELP)
    s.add_argument(
        "--cuda-graphs",
        choices=("auto", "off"),
        default=engine_defaults.CUDA_GRAPHS,
        help="decode steps captured once per batch size and replayed as CUDA graphs: auto = on CUDA, off = never "
        "(default auto)",
    )
    add_batch_invariant_flag(s)
    add_step_flags(s)
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
        help="split prompts into chunks of this many tokens that share steps with decodes; 0 = off "
        "(default off; 64 with --class)",
    )
    s.add_argument(
        "--no-chunked-prefill",
        dest="chunked_prefill",
        action="store_const",
        const=0,
        help="prefill whole prompts (the default without --class), as --chunked-prefill 0",
    )
    s.add_argument(
        "--prefix-caching",
        action="store_const",
        const=True,
        help="share the KV blocks of identical prompt prefixes between requests (default off; on with --class)",
    )
    s.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_const",
        const=False,
        help="compute every prompt's KV blocks afresh (the default without --class)",
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
    s.add_argument(
        "--draft-model",
        metavar="ID_OR_PATH",
        help="a small model with the same vocabulary (local folder or cached hub id) that proposes tokens in the "
        "speculative-decoding experiment (default: prompt lookup, no second model)",
    )
    s.add_argument(
        "--engine",
        metavar="openai:URL",
        help="drive the page with a remote OpenAI-compatible server (vLLM, llama.cpp, kvscope) instead of the built-in model",
    )
    s.add_argument(
        "--engine-model", metavar="NAME", help="with --engine: the model id to use (default: the first listed)"
    )
    s.add_argument(
        "--engine-config",
        metavar="PATH",
        help="with --engine: the model's config.json or its folder (KV bytes per token; a tokenizer there shows prompt tokens)",
    )
    s.add_argument(
        "--engine-top-logprobs",
        type=int,
        default=5,
        metavar="N",
        help="with --engine: candidates asked per token, 0-5 (0: none shown; much faster on llama.cpp's server)",
    )
    s.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help="model ids /v1 clients may send, as vLLM's flag (the first is the one reported); the model's own "
        "name (e.g. SmolLM2-135M-Instruct) always works too",
    )
    s.add_argument(
        "--api-key",
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on /v1/* (also KVSCOPE_API_KEY); never printed or logged",
    )
    s.set_defaults(func=serve)
    add_bench_parser(sub)  # a broken import fails loudly here, never hides the subcommand
    add_class_sim_parser(sub)
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
