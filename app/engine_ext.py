"""Attaches one Engine to the app (app.extensions["kvscope_engine"]); the engine never holds the app."""

from __future__ import annotations

import atexit

from flask import Flask, current_app

KEY = "kvscope_engine"


def init_app(app: Flask) -> None:
    engine = app.config.get("ENGINE")  # tests may inject a ready engine; its owner shuts it down
    if engine is None:
        from model_runner import config as engine_defaults
        from model_runner.engine import Engine, EngineConfig  # imported late: tests with a stub skip torch

        engine = Engine(
            EngineConfig(
                model=app.config["MODEL"],
                device=app.config["DEVICE"],
                dtype=app.config["DTYPE"],
                max_queue=int(app.config["MAX_QUEUE"]),
                timeout_s=float(app.config["TIMEOUT_S"]),
                kv_cache_mb=app.config["KV_CACHE_MB"],
                feed_text=bool(app.config["FEED_TEXT"]),
                policy=engine_defaults.POLICY.updated(dict(app.config["POLICY"])),
            )
        )
        engine.start()  # loads on the engine's worker thread: the app answers /api/model meanwhile
        atexit.register(engine.shutdown)  # in-flight requests end with `cancelled` (cause shutdown)
    app.extensions[KEY] = engine


def get_engine():
    return current_app.extensions[KEY]
