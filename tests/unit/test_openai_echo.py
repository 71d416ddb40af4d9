"""Echo with prompt logprobs (POST /v1/completions, lm-eval's loglikelihood): each prompt token's
log-probability comes from the prompt's one prefill (model_runner/local/step/prompt_logprobs.py) and equals
the model's own log-softmax from a plain forward, whole, in chunks, or after a prefix-cache hit; rows
that do not ask keep one position each, as before; the answer is OpenAI's shape (the first null)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from app import create_app
from model_runner.local.scheduler import Work
from model_runner.local.step.prompt_logprobs import kept_positions
from model_runner.protocol.request import parse_generate
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence

TEXT = "A KV cache keeps each token's keys and values, so a new token reads them instead of recomputing."
TOLERANCE = 1e-5  # float32 on both sides; the paged batched forward and a plain forward add in other orders


def scored(engine, text: str = TEXT, top: int = 2):
    params = parse_generate(
        {"messages": [{"role": "user", "content": text}], "max_new_tokens": 1, "prompt_logprobs": top}
    )
    handle = engine.submit(dataclasses.replace(params, chat_template=False))
    assert list(handle)[-1].type == "finished"
    return handle.sequence


def reference(engine, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = engine.loaded.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_matches_the_model(engine, seq, top: int = 2) -> None:
    ref = reference(engine, seq.prompt_ids)
    assert seq.prompt_logprobs[0] is None
    for position in range(1, len(seq.prompt_ids)):
        chosen, ranked = seq.prompt_logprobs[position]
        assert chosen == pytest.approx(ref[position - 1, seq.prompt_ids[position]].item(), abs=TOLERANCE)
        assert [i for i, _ in ranked] == torch.topk(ref[position - 1], top).indices.tolist()


def test_prompt_logprobs_equal_the_models_log_softmax(shared_engine):
    engine = shared_engine("fake")
    assert_matches_the_model(engine, scored(engine))


def test_prompt_logprobs_are_the_same_when_the_prompt_prefills_in_chunks(engine_factory):
    engine = engine_factory("fake", policy=Policy(chunked_prefill=True, chunk_size=16))
    assert_matches_the_model(engine, scored(engine))


def test_a_prefix_cache_hit_still_scores_every_prompt_position(engine_factory):
    engine = engine_factory("fake", policy=Policy(prefix_caching=True))
    scored(engine)  # fills the prefix cache
    again = scored(engine, TEXT + " And again.")
    assert again.prefix_hit > 0
    assert_matches_the_model(engine, again)


def row(tokens: int, kind: str = "prefill", asks: bool = False) -> Work:
    params = parse_generate(
        {"messages": [{"role": "user", "content": "x"}], **({"prompt_logprobs": 1} if asks else {})}
    )
    return Work(Sequence(id="r", params=params, prompt_ids=[1] * tokens), [1] * tokens, kind, True)


def test_rows_that_do_not_ask_keep_only_their_last_position():
    rows = [row(5), row(3, asks=True), row(1, "decode")]
    keep, wanted, spans = kept_positions(rows, [0, 5, 8, 9])
    assert keep == [4, 5, 6, 7, 8]  # one, all three of the asking row, one
    assert wanted == [0, 3, 4]  # each row's own last position among those kept
    assert [(first, end) for _, first, end in spans] == [(1, 4)]


def test_echo_answers_in_openais_shape_with_the_first_token_null(shared_engine):
    client = create_app({"TESTING": True, "ENGINE": shared_engine("fake")}).test_client()
    ids = list(TEXT.encode())
    body = {"prompt": [ids, ids[:20]], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234}
    reply = client.post("/v1/completions", json=body).get_json()  # lm-eval's loglikelihood request
    first, second = reply["choices"]
    logprobs = first["logprobs"]
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert len(logprobs["tokens"]) == len(ids) + 1  # the prompt, then the one generated token
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert first["text"].startswith(TEXT)
    seq = scored(shared_engine("fake"), TEXT, top=1)
    assert logprobs["token_logprobs"][1 : len(ids)] == [lp for lp, _ in seq.prompt_logprobs[1:]]
    for token, chosen, top in zip(logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
        assert top[token] == chosen and len(top) <= 2  # the token itself and the likeliest one
    assert len(second["logprobs"]["tokens"]) == 21


def test_echo_with_max_tokens_zero_returns_the_prompt_alone(shared_engine):
    client = create_app({"TESTING": True, "ENGINE": shared_engine("fake")}).test_client()
    reply = client.post(
        "/v1/completions", json={"prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 0}
    ).get_json()
    choice = reply["choices"][0]
    assert choice["text"] == TEXT and len(choice["logprobs"]["tokens"]) == len(TEXT.encode())
    assert reply["usage"]["completion_tokens"] == 0
    refused = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 0}).get_json()
    assert refused["error"]["param"] == "max_tokens"
