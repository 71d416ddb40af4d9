"""Echo's prompt logprobs on the bundled model (float32 route) are the model's: lm-eval's recorded
loglikelihood requests (tests/data/client_bodies, token ids as lm-eval 0.4.13 sends them) answered
through POST /v1/completions give, per prompt token, a direct transformers forward's log-softmax within
TOLERANCE; and the local multiple-choice task (tests/clients/lm_eval_tasks) picks, item by item, the
choice the in-process model's own log-likelihoods pick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app import create_app
from model_runner.loading.loader import cache_root, find_default_gguf

TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-4  # float32 both ways: the paged batched forward and a plain sdpa forward sum in other orders
SERVED = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(real_engine_float32):
    app = create_app({"TESTING": True, "ENGINE": real_engine_float32, "SERVED_MODEL_NAMES": [SERVED]})
    return app.test_client()


@pytest.fixture(scope="module")
def reference():
    """The converted model loaded afresh by transformers, float32, its own attention: no kvscope code runs."""
    from transformers import AutoModelForCausalLM

    folder = cache_root() / f"smollm2-135m-instruct-q4_1-{find_default_gguf().stat().st_size}"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def log_softmax(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)

    return log_softmax


def loglikelihood_bodies() -> list[dict]:
    doc = json.loads((TESTS / "data" / "client_bodies" / "lm-eval-0.4.13-loglikelihood.json").read_text())
    return [r["body"] for r in doc["requests"] if r["path"] == "/v1/completions"]


def prompt_logprobs(choice: dict, length: int) -> list[float]:
    return choice["logprobs"]["token_logprobs"][1:length]


def test_lm_evals_loglikelihood_requests_get_the_models_own_logprobs(client, reference):
    for body in loglikelihood_bodies():
        reply = client.post("/v1/completions", json=body).get_json()
        assert [c["index"] for c in reply["choices"]] == list(range(len(body["prompt"])))
        for ids, choice in zip(body["prompt"], reply["choices"]):
            logprobs = choice["logprobs"]
            assert len(logprobs["tokens"]) == len(ids) + 1 and logprobs["token_logprobs"][0] is None
            ref = reference(ids)
            expected = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
            assert prompt_logprobs(choice, len(ids)) == pytest.approx(expected, abs=TOLERANCE)


def test_a_multiple_choice_task_picks_what_the_models_own_loglikelihoods_pick(client, reference, real_engine_float32):
    tokenizer = real_engine_float32.loaded.tokenizer
    items = [json.loads(line) for line in (TESTS / "clients" / "lm_eval_tasks" / "mc.jsonl").read_text().splitlines()]
    for item in items[:4]:
        context = f"Question: {item['question']}\nAnswer:"
        context_ids = tokenizer.encode(context)[0]
        prompts = [tokenizer.encode(context + " " + choice)[0] for choice in item["choices"]]
        body = {"model": SERVED, "prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
        reply = client.post("/v1/completions", json=body).get_json()
        api = [sum(c["logprobs"]["token_logprobs"][len(context_ids) :]) for c in reply["choices"]]
        own = [sum(reference(ids)[i - 1, ids[i]].item() for i in range(len(context_ids), len(ids))) for ids in prompts]
        assert api == pytest.approx(own, abs=TOLERANCE * 10)
        assert max(range(len(api)), key=api.__getitem__) == max(range(len(own)), key=own.__getitem__), item
