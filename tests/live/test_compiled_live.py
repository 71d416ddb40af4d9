"""`kvscope serve --compile on` on the bundled model, as users run it: the server is ready and answers while its
decode stretches compile (or load from the cache) in the background, /api/model says so, and once they switch in
a greedy question gets the answer of a server that never compiles (the compiled step gives the eager step's bits:
tests/model/test_compiled_model.py)."""

from __future__ import annotations

import json
import time
import urllib.request

import openai
import pytest
from kvscope_testkit import WAIT_S

from model_runner.local.model.compiled import BUILD_TIMEOUT_S

QUESTION = [{"role": "user", "content": "Name three things a lighthouse keeper does."}]


def model_state(server) -> dict:
    with urllib.request.urlopen(server.url + "/api/model", timeout=WAIT_S) as response:
        return json.loads(response.read())


def answer(server) -> str:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=WAIT_S, max_retries=0)
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=24
    )
    return reply.choices[0].message.content


@pytest.fixture(scope="module")
def compiling_server(live_server):
    return live_server("default", args=("--compile", "on"))


def test_the_server_answers_while_it_compiles_then_switches_without_changing_an_answer(compiling_server, live_server):
    first = model_state(compiling_server)["compiled"]
    assert first["asked"] == "on" and first["state"] in ("compiling", "on"), first
    assert answer(compiling_server)  # served by whichever step runs now: eager while it compiles
    eager = live_server("default")  # the suite's servers run with KVSCOPE_COMPILE=off
    assert model_state(eager)["compiled"] == {"asked": "off", "state": "off", "reason": "--compile off"}
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while (state := model_state(compiling_server)["compiled"])["state"] == "compiling":
        assert time.monotonic() < deadline, "the compile never ended"
        time.sleep(0.5)
    assert state["state"] == "on", state
    assert "AOTInductor's library" in state["reason"]
    assert answer(compiling_server) == answer(eager)
