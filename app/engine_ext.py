"""Attaches one engine to the app (app.extensions["kvscope_engine"]): the built-in `Engine`, or a
`RemoteEngine` in front of an OpenAI-compatible server when ENGINE_URL is set; the engine never holds the app.
Also what every door reports of the engine's execution choices (its decoder, whether its decode stretches run
compiled, batch-invariant mode), for either engine: the built-in one says through its declared `LocalControls`, a
remote one has none of them."""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING, Any

from flask import Flask, current_app

from model_runner.interface import EngineInterface

if TYPE_CHECKING:  # imported late at run time: a test's injected engine needs neither torch nor a server
    from model_runner.local.engine import Engine
    from model_runner.remote.engine import RemoteEngine

KEY = "kvscope_engine"
NOT_ON_REMOTE = "batch-invariant mode is a mode of the built-in engine: a remote engine's server decides how it batches"
REMOTE_DECODER = {"name": None, "asked": None, "reason": "a remote engine: its server runs the model"}
REMOTE_COMPILED = {"asked": None, "state": "off", "reason": "a remote engine: its server runs the model"}


def init_app(app: Flask) -> None:
    engine: EngineInterface | None = app.config.get(
        "ENGINE"
    )  # tests may inject a ready engine; its owner shuts it down
    if engine is None:
        engine = remote_engine(app) if app.config.get("ENGINE_URL") else builtin_engine(app)
        engine.start()  # loads (or connects) on its own thread: the app answers /api/model meanwhile
        atexit.register(engine.shutdown)  # in-flight requests end with `cancelled` (cause shutdown)
    app.extensions[KEY] = engine


def builtin_engine(app: Flask) -> Engine:
    from model_runner.local import config as engine_defaults
    from model_runner.local.engine import Engine, EngineConfig  # imported late: tests with a stub skip torch

    return Engine(
        EngineConfig(
            model=app.config["MODEL"],
            device=app.config["DEVICE"],
            dtype=app.config["DTYPE"],
            cuda_graphs=str(app.config["CUDA_GRAPHS"]),
            decoder=str(app.config["DECODER"]),
            compile=str(app.config["COMPILE"]),
            max_queue=int(app.config["MAX_QUEUE"]),
            timeout_s=float(app.config["TIMEOUT_S"]),
            kv_cache_mb=app.config["KV_CACHE_MB"],
            feed_text=bool(app.config["FEED_TEXT"]),
            policy=engine_defaults.POLICY.updated(dict(app.config["POLICY"])),
        )
    )


def remote_engine(app: Flask) -> RemoteEngine:
    from model_runner.remote.engine import RemoteConfig, RemoteEngine  # no torch unless a tokenizer is loaded

    return RemoteEngine(
        RemoteConfig(
            url=str(app.config["ENGINE_URL"]),
            model=app.config.get("ENGINE_MODEL"),
            engine_config=app.config.get("ENGINE_CONFIG"),
            max_queue=int(app.config["MAX_QUEUE"]),
            timeout_s=float(app.config["TIMEOUT_S"]),
            top_logprobs=int(app.config.get("ENGINE_TOP_LOGPROBS", 5)),
        )
    )


def get_engine() -> EngineInterface:
    """The app's engine; what only the built-in engine can do is reached through `.local` (None when remote)."""
    return current_app.extensions[KEY]


def batch_invariance(engine: EngineInterface) -> dict[str, Any]:
    """The batch-invariant mode (the policy's `batch_invariant`) as the engine reports it: `on`, and when on
    what it rests on; a remote engine's is off, saying why."""
    local = engine.local
    return local.batch_invariance() if local is not None else {"on": False, "why_unavailable": NOT_ON_REMOTE}


def decoder(engine: EngineInterface) -> dict[str, Any] | None:
    """Which decoder runs the built-in engine's steps (None while it loads); a remote engine's server runs its own."""
    local = engine.local
    return local.decoder() if local is not None else REMOTE_DECODER


def compiled(engine: EngineInterface) -> dict[str, Any] | None:
    """Whether the built-in engine's decode stretches run compiled (None while it loads); a remote engine's
    server runs its own model."""
    local = engine.local
    return local.compiled() if local is not None else REMOTE_COMPILED
