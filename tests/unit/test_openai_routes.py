"""The routes tools probe beside the OpenAI API, in vLLM's shapes: /health (guidellm's first call),
/version, GET /v1/models/{id} (the SDK's models.retrieve), /tokenize, /detokenize and /tokenizer_info
(lm-eval's remote tokenizer); any unknown route or method under /v1 answers JSON in OpenAI's shape."""

from __future__ import annotations

import pytest

from app import create_app


@pytest.fixture(scope="module")
def client(shared_engine):
    app = create_app({"TESTING": True, "ENGINE": shared_engine("fake"), "API_KEY": "k", "SERVED_MODEL_NAMES": ["tiny"]})
    return app.test_client()


KEY = {"Authorization": "Bearer k"}


def test_health_and_version_answer_without_the_api_key(client):
    assert client.get("/health").status_code == 200
    assert client.get("/version").get_json()["version"]


def test_a_model_is_retrieved_by_any_id_it_answers_to_and_refused_otherwise(client):
    for name in ("tiny", "fake"):
        card = client.get(f"/v1/models/{name}", headers=KEY).get_json()
        assert card["id"] == name and card["object"] == "model" and card["max_model_len"] == 512
    missing = client.get("/v1/models/gpt-4o", headers=KEY)
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "model_not_found"


def test_tokenize_and_detokenize_round_trip_with_the_models_tokenizer(client):
    tokens = client.post("/tokenize", json={"prompt": "Hi <|im_end|>", "return_token_strs": True}).get_json()
    assert tokens["tokens"] == [72, 105, 32, 257] and tokens["count"] == 4 and tokens["max_model_len"] == 512
    assert tokens["token_strs"][-1] == "<|im_end|>"
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).get_json() == {"prompt": "Hi <|im_end|>"}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).get_json()
    assert chat["tokens"][0] == 256 and chat["count"] > 4  # the template's <|im_start|> first
    bad = client.post("/detokenize", json={"tokens": [999]})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "tokens"


def test_tokenizer_info_names_the_end_token(client):
    assert client.get("/tokenizer_info").get_json()["eos_token"] == "<|im_end|>"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("get", "/v1/nothing", 404, "not_found"),
        ("get", "/v1/chat/completions", 405, "method_not_allowed"),
        ("put", "/v1/models", 405, "method_not_allowed"),
    ],
)
def test_an_unknown_route_or_method_under_v1_answers_json_in_openais_shape(client, method, path, status, code):
    response = getattr(client, method)(path, headers=KEY)
    assert response.status_code == status and response.is_json
    assert (
        response.get_json()["error"]["code"] == code and response.get_json()["error"]["type"] == "invalid_request_error"
    )


def test_outside_v1_an_unknown_route_is_still_the_apps_own_404(client):
    assert client.get("/nothing-here").status_code == 404
