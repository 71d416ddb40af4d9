"""The experiments API of the serving chapter: GET /api/experiments lists them, POST
/api/experiments/<name> runs one on the app's engine (one job at a time, 409 busy; 403 not_allowed where
it needs a policy change this server refuses) and answers its measured result with the machine it ran on."""

from __future__ import annotations

import os
import platform
import threading

from flask import Blueprint, current_app, jsonify, request

from app.engine_ext import decoder, get_engine
from app.protocol import parse_json_object
from app.security import origin_refusal, policy_changes_allowed
from model_runner.protocol.errors import UserError
from serving_experiments.contract import decoder_words
from serving_experiments.harness import parse_params
from serving_experiments.registry import EXPERIMENTS, Experiment, experiment

bp = Blueprint("experiments", __name__)
LOCK_KEY = "kvscope_experiment_lock"
DRAFT_KEY = "kvscope_draft_model"


def init_app(app) -> None:
    app.extensions[LOCK_KEY] = threading.Lock()
    app.register_blueprint(bp)


def builtin(engine) -> bool:
    """The experiments need the built-in engine's model and paged pool: `engine.local` (None on a RemoteEngine)."""
    return engine.local is not None


def unavailable(exp: Experiment, engine) -> str | None:
    """Why this experiment cannot run on this server now, or None."""
    if not builtin(engine):
        return "the experiments need the built-in engine (this server forwards to a remote one)"
    state = engine.status()["status"]
    if state != "ready":
        return f"the model is {state}"
    if engine.local.paused:
        return "the teacher has paused admissions (class view)"
    if exp.needs_policy and not policy_changes_allowed():
        return (
            "it sets a scheduling policy for its run, which this server allows only on loopback "
            "(or when started with ALLOW_POLICY_CHANGES)"
        )
    return None


@bp.get("/api/experiments")
def listing():
    engine = get_engine()
    return jsonify(
        {
            "busy": current_app.extensions[LOCK_KEY].locked(),
            "experiments": [
                {
                    "name": e.name,
                    "title": e.title,
                    "available": (why := unavailable(e, engine)) is None,
                    "why_unavailable": why,
                }
                for e in EXPERIMENTS.values()
            ],
        }
    )


@bp.post("/api/experiments/<name>")
def run(name: str):
    refusal = origin_refusal(required=False)
    if refusal is not None:
        return refusal
    exp = experiment(name)
    body = request.get_data(as_text=True)
    params = parse_params(parse_json_object(body) if body.strip() else {}, exp.params)
    engine = get_engine()
    if not builtin(engine):
        raise UserError(unavailable(exp, engine), code="not_allowed")
    engine.describe_ready()  # 503 model_loading / model_failed
    if exp.needs_policy and not policy_changes_allowed():
        raise UserError(f"`{name}` needs a scheduling policy change: {unavailable(exp, engine)}", code="not_allowed")
    if engine.local.paused:  # its requests would wait until the job's deadline
        raise UserError("admissions are paused by the teacher; try again when the class resumes", code="busy")
    lock = current_app.extensions[LOCK_KEY]
    if not lock.acquire(blocking=False):
        raise UserError("another experiment is running; try again when it has finished", code="busy")
    try:
        result = exp.run(engine, params, **extras(name, engine))
    finally:
        lock.release()
    return jsonify(
        {"name": name, "provenance": "measured", "machine": machine(engine), "params": params, "result": result}
    )


def extras(name: str, engine) -> dict:
    if name == "speculative":
        draft = draft_proposer(engine)
        return {"proposer": draft} if draft is not None else {}
    return {}


def machine(engine) -> dict:
    import torch

    facts = engine.local.loaded.facts
    return {
        "cpu": platform.processor() or platform.machine(),
        "device": facts.device_name or facts.device,
        "route": facts.dtype_route,  # the weights' route (int4, int8, float32, ...): it sets every time measured
        # whether a prompt of FLOAT_ROWS tokens or more ran on float32 copies (int4 only): which kernel a prefill ran
        "float_prefill": bool((facts.cost_shape or {}).get("float_prefill")),
        "threads": torch.get_num_threads(),
        # the decoder that ran its steps, named as a recording names it: the same model runs at another speed on each
        "decoder": decoder_words(decoder(engine)),
        "load_1m": round(os.getloadavg()[0], 2),
    }


# ---- the optional draft model -----------------------------------------------------------------------------


def draft_proposer(engine):
    """A DraftModel when the server was started with --draft-model (loaded on first use), else None."""
    spec = current_app.config.get("DRAFT_MODEL")
    if not spec:
        return None
    cached = current_app.extensions.get(DRAFT_KEY)
    if cached is None:
        from model_runner.loading import loader
        from serving_experiments.speculative import DraftModel

        facts = engine.local.loaded.facts
        loaded = loader.load(spec, facts.device, facts.dtype)
        if loaded.facts.vocab_size != facts.vocab_size:
            raise UserError(
                f"the draft model's vocabulary ({loaded.facts.vocab_size}) differs from the model's ({facts.vocab_size})",
                code="not_allowed",
                field="draft_model",
            )
        cached = current_app.extensions[DRAFT_KEY] = DraftModel(loaded.model, spec.rstrip("/").split("/")[-1])
    return cached
