"""The bundled catalogue (static/data/model-configs.json) says where each entry was re-read: every source is
citable (a repository, path and commit, or a GitHub thread), and `unchecked` names only keys the entry holds."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = json.loads((ROOT / "static/data/model-configs.json").read_text(encoding="utf-8"))["models"]
COMMIT = re.compile(r"[0-9a-f]{40}")
THREAD = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+")


def config_keys(config: dict) -> set[str]:
    """The keys an entry states (model_type names the reader, it is not a value to check)."""
    text = config.get("text_config")
    keys = {k for k in config if k not in ("text_config", "model_type")}
    return keys | ({k for k in text if k != "model_type"} if isinstance(text, dict) else set())


def ids(model: dict) -> str:
    return model["id"]


@pytest.mark.parametrize("model", MODELS, ids=ids)
def test_every_source_can_be_cited(model):
    assert isinstance(model["sources"], list), model["id"]
    for source in model["sources"]:
        assert source["what"].strip(), source
        if "url" in source:
            assert THREAD.fullmatch(source["url"]), source["url"]
        else:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", source["repo"]) and source["path"], source
            assert COMMIT.fullmatch(source["commit"]), source["commit"]


@pytest.mark.parametrize("model", MODELS, ids=ids)
def test_unchecked_names_only_keys_the_entry_holds(model):
    unchecked = model["unchecked"]
    assert len(unchecked) == len(set(unchecked)), model["id"]
    assert set(unchecked) <= config_keys(model["config"]), model["id"]
    if not model["sources"]:
        # Nothing was re-read: the entry says so for every key it holds.
        assert set(unchecked) == config_keys(model["config"]), model["id"]
        assert "unchecked" in model["read_from"], model["id"]
