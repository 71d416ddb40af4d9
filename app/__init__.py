"""The Flask application factory: pages, JSON API and WebSocket, with the engine in app.extensions."""
from __future__ import annotations

import os

from flask import Flask

DEFAULTS = {
    "MODEL": "default",  # "default" (bundled SmolLM2-135M-Instruct), "fake" (tests), a hub id or a path
    "DEVICE": "auto",
    "DTYPE": "auto",
    "MAX_QUEUE": 64,
    "TIMEOUT_S": 120.0,
}


def create_app(test_config: dict | None = None) -> Flask:
    app = Flask(__name__, static_folder="../static", template_folder="../templates")
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("KVSCOPE")  # e.g. KVSCOPE_MODEL=fake
    if test_config:
        app.config.from_mapping(test_config)

    from . import engine_ext, pages
    engine_ext.init_app(app)
    app.register_blueprint(pages.bp)
    return app
