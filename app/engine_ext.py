"""Attaches one Engine to the app (app.extensions["kvscope_engine"]); the engine never holds the app."""
from __future__ import annotations

from flask import Flask, current_app

from model_runner.engine import Engine, EngineConfig

KEY = "kvscope_engine"


def init_app(app: Flask) -> None:
    engine = app.config.get("ENGINE")  # tests may inject a ready engine
    if engine is None:
        engine = Engine(EngineConfig(
            model=app.config["MODEL"], device=app.config["DEVICE"], dtype=app.config["DTYPE"],
            max_queue=int(app.config["MAX_QUEUE"]), timeout_s=float(app.config["TIMEOUT_S"]),
        ))
        engine.start()
    app.extensions[KEY] = engine


def get_engine() -> Engine:
    return current_app.extensions[KEY]
