"""The JSON API: model status and facts, prompt preview (template, tokens, budget), health.

Every error answer is `{code, field, message}`, the same shape as the WebSocket `error` event
(app/errors.py renders it).
"""

from __future__ import annotations

from flask import Blueprint, jsonify, request

from app.engine_ext import batch_invariance, compiled, decoder, get_engine
from app.model_names import public_source
from app.protocol import parse_json_object
from app.security import origin_refusal, policy_changes_allowed
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import LIMITS, parse_generate

bp = Blueprint("api", __name__)


def public_facts(facts) -> dict:
    """The model's facts as any client may see them: where it came from by package or folder name,
    never the server's filesystem path."""
    data = facts.to_dict()
    return {**data, "name": public_source(data.get("name")), "source": public_source(data.get("source"))}


@bp.get("/api/model")
def model():
    engine = get_engine()
    state = engine.status()
    facts = engine.facts if state["status"] == "ready" else None
    return jsonify(
        {
            "status": state["status"],
            "reason": state.get("reason"),
            "facts": public_facts(facts) if facts is not None else None,
            "limits": LIMITS,
            "batch_invariant": batch_invariance(engine),
            "decoder": decoder(engine),
            "compiled": compiled(engine),
        }
    )


@bp.post("/api/prompt")
def prompt():
    """What `generate` would send to the model, without generating; the page calls it as you type."""
    refusal = origin_refusal(required=False)
    if refusal is not None:
        return refusal
    if not request.is_json:
        raise UserError("send the conversation as JSON (Content-Type: application/json)", code="invalid_json")
    params = parse_generate(parse_json_object(request.get_data(as_text=True)))
    return jsonify(get_engine().describe_prompt(params))  # raises model_loading / model_failed itself


@bp.get("/api/engine")
def engine_state():
    """The engine's counters, KV pool and scheduling policy right now (the feed's snapshot)."""
    engine = get_engine()
    engine.describe_ready()  # model_loading / model_failed, as for every other model call
    return jsonify(engine.snapshot())


@bp.post("/api/engine/policy")
def engine_policy():
    """Change scheduling policies live, e.g. {"batching": "static"}; answers the policy now in force.
    Allowed on a loopback server only (or when ALLOW_POLICY_CHANGES is set): on a shared network a
    student's page must not flip the engine for everyone."""
    refusal = origin_refusal(required=False)
    if refusal is not None:
        return refusal
    if not policy_changes_allowed():
        raise UserError(
            "scheduling policies can be changed only on a server that listens on loopback "
            "(or started with ALLOW_POLICY_CHANGES)",
            code="forbidden",
        )
    changes = parse_json_object(
        request.get_data(as_text=True), 'send the policy changes as a JSON object, e.g. {"batching": "static"}'
    )
    return jsonify({"policy": get_engine().set_policy(changes).to_dict()})


@bp.get("/healthz")
def healthz():
    ok, why = get_engine().health()
    response = jsonify({"ok": ok, "why": why, "status": get_engine().status()["status"]})
    response.status_code = 200 if ok else 503
    return response
