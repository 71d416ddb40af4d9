"""The scheduling policy from outside the engine: the HTTP policy API changes it on a loopback
server and refuses bad input with the documented error shape (naming the field); the `kvscope
serve` flags add to the policy from the environment instead of replacing it."""

from __future__ import annotations

import argparse

import pytest

from app import create_app
from kvscope.cli import policy_of
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.protocol.errors import UserError


@pytest.fixture(scope="module")
def policy_client():
    engine = Engine(EngineConfig(model="fake"), loaded=load("fake"))
    return create_app({"TESTING": True, "ENGINE": engine}).test_client()


@pytest.mark.parametrize(
    "body, code, field",
    [
        ('{"self": 1}', "invalid_request", "self"),
        ('{"max_num_seqs": 0}', "invalid_request", "max_num_seqs"),
        ("[1, 2]", "invalid_json", None),
        ("{oops", "invalid_json", None),
    ],
)
def test_the_policy_api_answers_bad_input_with_the_error_shape(policy_client, body, code, field):
    res = policy_client.post("/api/engine/policy", data=body, content_type="application/json")
    assert res.status_code == 400
    assert (res.get_json()["code"], res.get_json()["field"]) == (code, field)


def test_the_policy_api_changes_the_policy_on_a_loopback_server(policy_client):
    res = policy_client.post("/api/engine/policy", json={"batching": "static", "max_num_seqs": 4})
    assert res.status_code == 200 and res.get_json()["policy"]["batching"] == "static"
    assert policy_client.get("/api/engine").get_json()["policy"]["max_num_seqs"] == 4


def flags(**given):
    defaults = {"max_num_seqs": None, "batching": None, "prefix_caching": None, "chunked_prefill": None}
    return argparse.Namespace(**{**defaults, **given})


def test_serve_flags_add_to_the_environment_policy_instead_of_replacing_it(monkeypatch):
    monkeypatch.setenv("KVSCOPE_POLICY", '{"prefix_caching": true, "chunked_prefill": true}')
    assert policy_of(flags(max_num_seqs=4)) == {"prefix_caching": True, "chunked_prefill": True, "max_num_seqs": 4}
    assert policy_of(flags(chunked_prefill=0))["chunked_prefill"] is False
    monkeypatch.setenv("KVSCOPE_POLICY", '{"max_num_seqs": 0}')
    with pytest.raises(UserError) as info:
        policy_of(flags())
    assert info.value.field == "max_num_seqs"
