"""The one error mapping (app/errors.py): every blueprint answers a UserError with the status of the
one table and in the shape its contract documents (flat for /api, OpenAI's for /v1, nested for the
class and experiments APIs); a body over the limit is 413 `too_large` in that shape; an unexpected
failure in a JSON-only blueprint is one JSON `internal` 500, elsewhere Flask's own."""

from __future__ import annotations

import pytest

from app import create_app
from app.errors import STATUS
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.protocol.errors import UserError

# (method, path, shape) for a route of each blueprint that reaches the engine's status, snapshot or readiness.
ROUTES = {
    "flat": ("GET", "/api/engine"),
    "openai": ("GET", "/v1/models"),
    "class": ("GET", "/api/class"),
    "experiments": ("GET", "/api/experiments"),
}
BIG = "x" * 300_000  # over MAX_CONTENT_LENGTH (256 KiB)
BODY_ROUTES = {
    "flat": "/api/prompt",
    "openai": "/v1/chat/completions",
    "class": "/api/class/settings",
    "experiments": "/api/experiments/why_batch",
}


class Failing:
    """A ready engine whose status, snapshot and readiness check raise `exc`."""

    def __init__(self, engine, exc: Exception):
        self.engine, self.exc = engine, exc

    def _raise(self, *args, **kwargs):
        raise self.exc

    status = snapshot = describe_ready = _raise

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def ready():
    """Loaded (the fake model) with no worker thread: nothing runs, which these answers never need."""
    return Engine(EngineConfig(model="fake"), loaded=load("fake"))


def client_for(engine):
    return create_app({"TESTING": True, "ENGINE": engine}).test_client()


def fields_of(shape: str, body: dict) -> tuple[str, str | None, str]:
    """(code, field, message) read the way the shape's contract says."""
    if shape == "openai":
        error = body["error"]
        assert error["type"] == "invalid_request_error"
        return error["code"], error["param"], error["message"]
    if shape in ("class", "experiments"):  # nested, and the same fields flat beside it
        assert {k: body[k] for k in ("code", "field", "message")} == body["error"]
        body = body["error"]
    else:
        assert "error" not in body
    return body["code"], body["field"], body["message"]


@pytest.mark.parametrize("code", [*STATUS, "invalid_request", "context_overflow"])
@pytest.mark.parametrize("shape", list(ROUTES))
def test_each_code_answers_the_one_tables_status_in_each_blueprints_shape(ready, shape, code):
    method, path = ROUTES[shape]
    exc = UserError(f"made to fail with {code}", code=code, field="some_field")
    response = client_for(Failing(ready, exc)).open(path, method=method)
    assert response.status_code == STATUS.get(code, 400)
    assert fields_of(shape, response.get_json()) == (code, "some_field", f"made to fail with {code}")


@pytest.mark.parametrize("shape", list(BODY_ROUTES))
def test_a_body_over_the_limit_is_too_large_in_each_blueprints_shape(ready, shape):
    response = client_for(ready).post(BODY_ROUTES[shape], data=BIG, content_type="application/json")
    assert response.status_code == 413
    code, field, message = fields_of(shape, response.get_json())
    assert (code, field) == ("too_large", None) and "262,144 bytes" in message


@pytest.mark.parametrize("shape", ["flat", "openai", "experiments"])
def test_an_unexpected_failure_of_a_json_api_is_one_internal_error(ready, shape):
    method, path = ROUTES[shape]
    response = client_for(Failing(ready, RuntimeError("disk on fire"))).open(path, method=method)
    assert response.status_code == 500
    code, _, message = fields_of(shape, response.get_json())
    assert code == "internal" and path in message and "RuntimeError: disk on fire" in message


def test_an_unexpected_failure_elsewhere_is_left_to_flask(ready):
    with pytest.raises(RuntimeError, match="disk on fire"):  # TESTING propagates it: no JSON made up
        client_for(Failing(ready, RuntimeError("disk on fire"))).get("/api/class")


def test_an_unknown_route_is_werkzeugs_404(ready):
    response = client_for(ready).get("/api/nothing-here")
    assert response.status_code == 404 and response.mimetype == "text/html"
