"""The experiments API of the serving chapter: GET /api/experiments lists them, POST
/api/experiments/<name> runs one on the app's engine (one job at a time, 409 busy; 403 not_allowed where
it needs a policy change this server refuses) and answers its measured result with the machine it ran on."""

from __future__ import annotations

import functools
import os
import platform
import threading

from flask import Blueprint, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from model_runner.errors import UserError
from serving_experiments import experiments as lab

from .api import STATUS_FOR_CODE, nested_error, policy_changes_allowed
from .engine_ext import get_engine
from .protocol import parse_json_object
from .security import origin_refusal

bp = Blueprint("experiments", __name__)
LOCK_KEY = "kvscope_experiment_lock"
DRAFT_KEY = "kvscope_draft_model"
STATUS = {**STATUS_FOR_CODE, "busy": 409, "not_allowed": 403, "not_found": 404}


def init_app(app) -> None:
    app.extensions[LOCK_KEY] = threading.Lock()
    app.register_blueprint(bp)


@bp.errorhandler(UserError)
def _user_error(exc: UserError):
    return nested_error(exc, STATUS)


@bp.errorhandler(Exception)
def _failed(exc: Exception):
    """An experiment that breaks answers one JSON error (and the log has the traceback), never an HTML page."""
    if isinstance(exc, HTTPException):
        return exc
    current_app.logger.exception("experiment failed")
    return _user_error(UserError(f"the experiment failed: {type(exc).__name__}: {exc}"[:300], code="internal"))


def builtin(engine) -> bool:
    """The experiments need the built-in engine's model and paged pool (a RemoteEngine has a feed only)."""
    return all(hasattr(engine, name) for name in ("feed", "loaded", "pool"))


def unavailable(exp: lab.Experiment, engine) -> str | None:
    """Why this experiment cannot run on this server now, or None."""
    if not builtin(engine):
        return "the experiments need the built-in engine (this server forwards to a remote one)"
    state = engine.status()["status"]
    if state != "ready":
        return f"the model is {state}"
    if getattr(engine, "paused", False):
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
                for e in lab.EXPERIMENTS.values()
            ],
        }
    )


@bp.post("/api/experiments/<name>")
def run(name: str):
    refusal = origin_refusal(required=False)
    if refusal is not None:
        return refusal
    exp = lab.experiment(name)
    body = request.get_data(as_text=True)
    params = lab.parse_params(parse_json_object(body) if body.strip() else {}, exp.params)
    engine = get_engine()
    if not builtin(engine):
        raise UserError(unavailable(exp, engine), code="not_allowed")
    engine.describe_ready()  # 503 model_loading / model_failed
    if exp.needs_policy and not policy_changes_allowed():
        raise UserError(f"`{name}` needs a scheduling policy change: {unavailable(exp, engine)}", code="not_allowed")
    if getattr(engine, "paused", False):  # its requests would wait until the job's deadline
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
    if name == "why_batch":
        return {"roofline": functools.partial(roofline, engine)}
    if name == "speculative":
        draft = draft_proposer(engine)
        return {"proposer": draft} if draft is not None else {}
    return {}


def machine(engine) -> dict:
    import torch

    facts = engine.loaded.facts
    return {
        "cpu": platform.processor() or platform.machine(),
        "device": facts.device_name or facts.device,
        "threads": torch.get_num_threads(),
        "load_1m": round(os.getloadavg()[0], 2),
    }


# ---- the roofline: the machine's ceilings (measured once per process) and the model's shape -------------


@functools.lru_cache(maxsize=4)
def ceilings(device: str, dtype: str) -> tuple[float, float]:
    """(matmul FLOP/s, copy bytes/s) of this machine, as `kvscope bench` measures them."""
    import torch

    from bench import baselines as bl

    dev = torch.device(device)
    matmul = bl.matmul_rate(dev, getattr(torch, dtype))
    copy = bl.copy_bandwidth(dev)
    return matmul["gflop_per_s"] * 1e9, copy["gb_per_s"] * 1e9


def roofline(engine, prefill: dict, decodes: list[dict]) -> dict:
    """Each measured step as a point: arithmetic intensity (FLOPs per byte read, from the model's shape)
    against FLOP/s achieved (those FLOPs over the measured time), under the machine's two ceilings."""
    from bench.baselines import Shape

    facts = engine.loaded.facts
    shape = Shape.of(facts, engine.loaded.model.config)
    peak, bandwidth = ceilings(facts.device, facts.dtype)
    flops = shape.prefill_flops(prefill["tokens"])
    read = shape.decode_bytes(prefill["tokens"])  # weights once, plus the prompt's keys and values written
    points = [
        {
            "phase": "prefill",
            "tokens": prefill["tokens"],
            "intensity": round(flops / read, 3),
            "flops_s": round(flops / (prefill["ms"] / 1000), 1),
        }
    ]
    for d in decodes:
        flops = d["batch"] * decode_flops(shape, d["context"])
        read = shape.decode_bytes(0) + d["batch"] * shape.kv_bytes_per_token * d["context"]
        points.append(
            {
                "phase": "decode",
                "batch": d["batch"],
                "intensity": round(flops / read, 3),
                "flops_s": round(flops / (d["ms"] / 1000), 1),
            }
        )
    return {
        "peak_flops_s": round(peak, 1),
        "bandwidth_bytes_s": round(bandwidth, 1),
        "ridge_intensity": round(peak / bandwidth, 3),
        "points": points,
        "basis": "peak and bandwidth measured on this machine (matmul, copy); FLOPs and bytes computed from "
        "the model's shape; times measured in this run",
    }


def decode_flops(shape, context: float) -> float:
    """One decode token: 2 x (non-embedding parameters), one row of logits, and attention over `context`."""
    non_embedding = shape.params - shape.embedding_params * (1 if shape.tied_embeddings else 2)
    attention = 4 * shape.layers * context * shape.attention_heads * shape.head_dim
    return 2 * non_embedding + 2 * shape.embedding_params + attention


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

        facts = engine.loaded.facts
        loaded = loader.load(spec, facts.device, facts.dtype)
        if loaded.facts.vocab_size != facts.vocab_size:
            raise UserError(
                f"the draft model's vocabulary ({loaded.facts.vocab_size}) differs from the model's ({facts.vocab_size})",
                code="not_allowed",
                field="draft_model",
            )
        cached = current_app.extensions[DRAFT_KEY] = DraftModel(loaded.model, spec.rstrip("/").split("/")[-1])
    return cached
