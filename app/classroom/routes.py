"""Classroom mode over HTTP: the projected /class page and its QR code, /api/class with the teacher's
controls (behind a key compared in constant time, never logged; batch-invariant mode among them), the
laptop cookie, and the seat each WebSocket gets. The room itself (settings, seats, caps, counters) is app/classroom/room.py, without Flask;
errors answer through the app's one mapping (app/errors.py: nested under `error`, `teacher_only` 403)."""

from __future__ import annotations

import hmac
import io
import logging
import secrets

from flask import Blueprint, Flask, Response, current_app, jsonify, redirect, render_template, request

from app.classroom.room import Room, Seat
from app.engine_ext import NOT_ON_REMOTE, batch_invariance, get_engine
from app.protocol import parse_json_object
from app.security import is_loopback, origin_refusal
from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import check_bool
from model_runner.shared.policy import Policy

log = logging.getLogger(__name__)
bp = Blueprint("classroom", __name__)

KEY = "kvscope_class"
COOKIE = "kvscope_teacher"
LAPTOP_COOKIE = "kvscope_laptop"  # a random id per browser: one "laptop N" for all its sockets
LAPTOP_COOKIE_S = 12 * 3600  # a school day; a new day starts numbering afresh
HEADER = "X-Teacher-Key"


def init_app(app: Flask) -> None:
    app.extensions[KEY] = Room(
        app.extensions["kvscope_engine"],
        class_mode=bool(app.config.get("CLASS_MODE")),
        per_laptop_cap=int(app.config["MAX_INFLIGHT_PER_SOCKET"]),
    )
    app.register_blueprint(bp)
    app.after_request(_give_laptop_id)


def _give_laptop_id(response: Response) -> Response:
    """In class mode, a page answered to a browser without one gets a random laptop id (no name,
    no address: only so its sockets count as one laptop)."""
    if _class_mode() and response.mimetype == "text/html" and LAPTOP_COOKIE not in request.cookies:
        response.set_cookie(
            LAPTOP_COOKIE, secrets.token_urlsafe(12), max_age=LAPTOP_COOKIE_S, httponly=True, samesite="Strict"
        )
    return response


def get_room() -> Room:
    return current_app.extensions[KEY]


def seat_for_socket() -> Seat | None:
    """The seat of a WebSocket being opened (in its handshake's request context): in class mode or
    on a loopback server; None elsewhere (a plain LAN server keeps plain sockets)."""
    config = current_app.config
    if not (_class_mode() or is_loopback(str(config.get("BIND_HOST", "")).strip("[]").lower())):
        return None
    laptop_id = request.cookies.get(LAPTOP_COOKIE) if _class_mode() else None  # else: one laptop per socket
    return get_room().seat(teacher=has_teacher_key(), laptop_id=laptop_id)


def _class_mode() -> bool:
    return bool(current_app.config.get("CLASS_MODE"))


# ---- who is the teacher ----------------------------------------------------------------------------


def _key_matches(given: str | None) -> bool:
    key = current_app.config.get("TEACHER_KEY")
    if not key or not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), str(key).encode("utf-8"))


def has_teacher_key() -> bool:
    """The teacher's cookie or X-Teacher-Key header holds the key (compared in constant time)."""
    return _key_matches(request.cookies.get(COOKIE)) or _key_matches(request.headers.get(HEADER))


def is_teacher() -> bool:
    """The key, or (outside class mode) a request from this machine: a teacher on their own laptop."""
    if has_teacher_key():
        return True
    return not _class_mode() and is_loopback(request.remote_addr or "")


class TeacherOnly(UserError):
    def __init__(self):
        super().__init__(
            "only the teacher may do this: open the teacher URL that `kvscope serve --class` printed",
            code="teacher_only",
        )


@bp.before_request
def _only_the_teacher_changes_things():
    """Every POST here is a teacher's control: a foreign Origin is refused first, then anyone
    without the key; GETs (the page, the QR code, the state) are for everyone."""
    if request.method != "POST":
        return None
    refusal = origin_refusal(required=False)
    if refusal is not None:
        return refusal
    if not is_teacher():
        raise TeacherOnly()
    return None


# ---- the page and what everyone may read ----------------------------------------------------------------


def join_url() -> str:
    return current_app.config.get("JOIN_URL") or request.host_url


@bp.get("/class")
def class_page():
    given = request.args.get("key")
    if given is not None and _key_matches(given):
        # The key leaves the address bar (and the history) at once; the cookie carries it from here.
        response = redirect("/class", code=303)
        response.set_cookie(COOKIE, given, httponly=True, samesite="Strict", path="/")
        return response
    status = 403 if given is not None else 200
    return render_template("class.html", join_url=join_url(), teacher=is_teacher(), class_mode=_class_mode()), status


@bp.get("/class/qr.svg")
def qr_svg():
    import segno  # imported here: only the projector asks for it

    out = io.BytesIO()
    segno.make(join_url(), error="m").save(out, kind="svg", scale=10, border=2, dark="#000", light="#fff")
    response = Response(out.getvalue(), mimetype="image/svg+xml")
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/api/class")
def class_state():
    room = get_room()
    return jsonify(
        {
            "class_mode": _class_mode(),
            "join_url": join_url(),
            "teacher": is_teacher(),
            "laptops": room.laptops,
            "settings": room.current().to_dict(),
            "policy": get_engine().snapshot()["policy"],
            "batch_invariant": batch_invariance(get_engine()),
        }
    )


# ---- the teacher's controls (checked by _only_the_teacher_changes_things) -------------------------------


def _body() -> dict:
    text = request.get_data(as_text=True)
    return parse_json_object(text) if text.strip() else {}


@bp.post("/api/class/settings")
def class_settings():
    return jsonify({"settings": get_room().update(_body()).to_dict()})


@bp.post("/api/class/policy")
def class_policy():
    """The engine's run-time policies, as POST /api/engine/policy, for the teacher on any address."""
    return jsonify({"policy": _set_policy(_body()).to_dict()})


@bp.post("/api/class/cancel-all")
def class_cancel_all():
    _body()  # a malformed body is still refused, as on every other control
    return jsonify({"cancelled": get_room().cancel_all()})


@bp.post("/api/class/batch-invariant")
def class_batch_invariant():
    """Batch-invariant mode on or off, `{"on": bool}`: the policy's `batch_invariant`, set as /api/class/policy
    sets any policy (refused while prefix caching is on). Answers the mode now."""
    body = _body()
    for name in body:
        if name != "on":
            raise UserError(f"`{name}` is not a field of this control; it takes only `on` (true or false)", field=name)
    if "on" not in body:
        raise UserError("`on` is required: true switches batch-invariant mode on, false off", field="on")
    on = check_bool("on", body["on"])
    if get_engine().local is None:  # a remote engine's server schedules: it refuses any policy change
        raise UserError(NOT_ON_REMOTE, field="batch_invariant")
    _set_policy({"batch_invariant": on})
    return jsonify({"batch_invariant": batch_invariance(get_engine())})


def _set_policy(changes: dict) -> Policy:
    """The teacher's policy change; one that switches batch-invariant mode is logged and told to every class
    view on the feed (a class_state carrying the mode: only the teacher's change sends one, so a view that
    sees the mode change knows the teacher changed it)."""
    engine = get_engine()
    policy = engine.set_policy(changes)
    if "batch_invariant" in changes:
        log.info("class: the teacher turned batch-invariant mode %s", "on" if policy.batch_invariant else "off")
        room = get_room()
        engine.feed.publish(
            "class_state",
            laptops=room.laptops,
            settings=room.current().to_dict(),
            batch_invariant=batch_invariance(engine),
        )
    return policy


@bp.post("/api/class/stage")
def class_stage():
    return jsonify({"stage": get_room().set_stage(_body().get("stage"))})
