"""The Flask application factory: pages, JSON API and WebSocket, with the engine in app.extensions.

Configuration comes from DEFAULTS, then KVSCOPE_* environment variables (values parsed as JSON
where they are JSON, e.g. KVSCOPE_ALLOWED_ORIGINS='["http://lab.example:8000"]'), then `test_config`.
"""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from model_runner.local import config as engine_defaults

FRAME_LIMIT = 256 * 1024  # room for the 60,000-character limit even in 4-byte UTF-8

DEFAULTS = {
    "MODEL": "default",  # "default" (bundled SmolLM2-135M-Instruct), "fake" (tests), a hub id or a path
    "DEVICE": "auto",
    "DTYPE": "auto",
    "CUDA_GRAPHS": engine_defaults.CUDA_GRAPHS,  # "auto" (on CUDA) or "off" (model_runner/local/step/graphs.py)
    "DECODER": "auto",  # `--decoder`: one of engine_defaults.DECODERS (model_runner/local/model/decoders.py)
    "COMPILE": "auto",  # `--compile`: one of engine_defaults.COMPILE (model_runner/local/model/compiled.py)
    "MAX_QUEUE": engine_defaults.MAX_QUEUE,
    "TIMEOUT_S": engine_defaults.TIMEOUT_S,
    # Security: the address the server listens on. On a loopback address only loopback Host names
    # are answered (DNS rebinding); ALLOWED_HOSTS replaces that list, e.g. for a LAN address.
    "BIND_HOST": "127.0.0.1",
    "ALLOWED_HOSTS": [],
    "ALLOWED_ORIGINS": [],  # origins allowed besides the page's own, e.g. ["http://lab.example:8000"]
    # WebSocket limits
    "SOCK_SERVER_OPTIONS": {"max_message_size": FRAME_LIMIT, "ping_interval": 20},
    "MAX_INFLIGHT_PER_SOCKET": 4,
    "MAX_SOCKETS": 96,  # keep below gunicorn's thread count (128 in `kvscope serve`) so pages still load
    "SEND_TIMEOUT_S": 30.0,  # a client that reads nothing for this long is dropped (cause slow_client)
    "WS_IDLE_TIMEOUT_S": 600.0,
    "MAX_CONTENT_LENGTH": FRAME_LIMIT,
    "LOG_LEVEL": "INFO",
    # The paged KV pool (None = one full context window) and whether policies may change over HTTP
    # (None = only when listening on loopback).
    "KV_CACHE_MB": None,
    # Scheduling policy changes from the default, e.g. {"max_num_seqs": 1} (see docs/protocol.md); batch-invariant
    # mode is one of them, {"batch_invariant": true}, as `--batch-invariant` sets it.
    "POLICY": {},
    "ALLOW_POLICY_CHANGES": None,
    "FEED_TEXT": False,  # prompt/answer text in the engine feed; off unless the teacher says so
    "DRAFT_MODEL": None,  # speculative experiment's draft model (`--draft-model`); None = prompt lookup
    # Classroom mode (`kvscope serve --class`, app/classroom/routes.py): the teacher's key (None = no key
    # works), the extra Host names students use (the LAN address, the hostname) and the join URL.
    "CLASS_MODE": False,
    "TEACHER_KEY": None,
    "CLASS_HOSTS": [],
    "JOIN_URL": None,
    # A remote OpenAI-compatible server instead of the built-in model (`kvscope serve --engine openai:URL`):
    # its URL, the model id it serves (None = the first listed) and the model's config.json or folder.
    "ENGINE_URL": None,
    "ENGINE_MODEL": None,
    "ENGINE_CONFIG": None,
    "ENGINE_TOP_LOGPROBS": 5,  # candidates asked per token from the remote; 0 = none (faster on llama.cpp)
    "API_KEY": None,  # when set, /v1/* requires `Authorization: Bearer API_KEY` (KVSCOPE_API_KEY)
    # `--served-model-name`: ids /v1 answers to besides the model's own; the first is the one reported.
    "SERVED_MODEL_NAMES": [],
}


def page_folder(name: str) -> Path:
    """static/ or templates/: inside the installed package after `pip install .`, else the
    repository's top-level folder (a source checkout or an editable install)."""
    installed = Path(__file__).resolve().parent / name
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / name


def create_app(test_config: dict | None = None) -> Flask:
    app = Flask(__name__, static_folder=page_folder("static"), template_folder=page_folder("templates"))
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("KVSCOPE")  # e.g. KVSCOPE_MODEL=fake
    if test_config:
        app.config.from_mapping(test_config)
    app.logger.setLevel(app.config["LOG_LEVEL"])  # one line per request outcome goes to the server log

    # The shared floor first, then each door (a feature room: no room imports another).
    from app import api, engine_ext, errors, experiments, metrics, pages, security
    from app.classroom import routes as classroom
    from app.openai import responses  # noqa: F401  (adds POST /v1/responses to the /v1 blueprint)
    from app.openai import routes as openai_api
    from app.ws import routes as ws

    errors.init_app(app)  # one error mapping: UserError code → status, in each blueprint's shape
    engine_ext.init_app(app)
    security.init_app(app)
    classroom.init_app(app)  # /class, /api/class*; needs the engine, so after engine_ext
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(openai_api.bp)  # /v1: the OpenAI-compatible API
    experiments.init_app(app)  # /api/experiments: the serving chapter's measured experiments
    metrics.init_app(app)  # GET /metrics (Prometheus); needs the engine, so after engine_ext
    ws.init_app(app, seat_for_socket=classroom.seat_for_socket)  # a classroom seat for each socket that has one
    return app
