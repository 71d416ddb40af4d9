"""The thing under test, opened: an in-process engine, or a running `kvscope serve` over its
WebSocket with a local copy of the same model for prompts and baselines."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from model_runner.errors import UserError

from .clients import InProcessClient, WebSocketClient


@dataclass
class Target:
    """The engine as the bench reaches it, and the model object the baselines run on."""

    mode: str
    client: Any
    loaded: Any  # LoadedModel: model, tokenizer adapter, facts
    describe: Callable[[Any], dict]  # GenerateParams -> describe_prompt's dict
    close: Callable[[], None]
    notes: list[str] = field(default_factory=list)


def open_target(args: argparse.Namespace, max_clients: int) -> Target:
    if args.via_websocket:
        return _websocket_target(args)
    from model_runner.local.engine import Engine, EngineConfig

    engine = Engine(
        EngineConfig(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            max_queue=max(64, max_clients),
            timeout_s=600.0,
            kv_cache_mb=getattr(args, "kv_cache_mb", None),
            decoder=getattr(args, "decoder", "auto"),
        )
    ).start()
    try:
        engine.wait_ready(900)
    except RuntimeError as exc:
        engine.shutdown()
        raise UserError(f"the model did not load: {exc}", code="model_failed", field="model") from None
    return Target("in-process", InProcessClient(engine), engine.loaded, engine.describe_prompt, engine.shutdown)


def _websocket_target(args: argparse.Namespace) -> Target:
    """The server runs the engine; this process loads the same model for prompts and baselines."""
    import urllib.request
    from urllib.parse import urlsplit

    from model_runner.loading.loader import load
    from model_runner.text.prompt import plan

    parts = urlsplit(args.via_websocket)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise UserError(
            f"--via-websocket must be a ws:// or wss:// URL, got {args.via_websocket!r}", field="via_websocket"
        )
    http = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}/api/model"
    try:
        with urllib.request.urlopen(http, timeout=10) as response:
            server = json.load(response)
    except OSError as exc:
        raise UserError(
            f"--via-websocket: cannot reach {http} ({exc}); is `kvscope serve` running?", field="via_websocket"
        ) from None
    if server.get("status") != "ready":
        raise UserError(
            f"--via-websocket: the server's model is {server.get('status')}; try again when it is ready",
            code="model_loading",
            field="via_websocket",
        )
    loaded = load(args.model, args.device, args.dtype)
    target = Target(
        "websocket",
        WebSocketClient(args.via_websocket),
        loaded,
        lambda params: plan(loaded.tokenizer, params, loaded.facts.context_window).to_dict(),
        lambda: None,
    )
    served = (server.get("facts") or {}).get("name")
    if served != loaded.facts.name:
        target.notes.append(
            f"the server runs {served!r} but the baselines ran {loaded.facts.name!r}: pass the "
            "server's model with --model"
        )
    target.notes.append(
        "over the WebSocket the baselines ran in the bench process, on its own copy of the same "
        "weights, while the server sat idle"
    )
    return target
