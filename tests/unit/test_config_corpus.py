"""The config reader against real files: every config.json in tests/data/configs/ (70+ files, 50+ model types,
each copied from a named repository and commit) read into the layer groups, bytes per token and context worked out
by hand in SOURCES.json; files that set keys the calculator does not model are refused with those keys named."""

import json
import re
from pathlib import Path

import pytest

from formulas import kv_config, kv_layers

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/data/configs"
MANIFEST = json.loads((CORPUS / "SOURCES.json").read_text(encoding="utf-8"))["configs"]
COMMIT = re.compile(r"[0-9a-f]{40}")


def config_of(entry: dict) -> dict:
    return json.loads((CORPUS / entry["file"]).read_text(encoding="utf-8"))


def ids(entry: dict) -> str:
    return entry["file"].removesuffix(".json")


def test_the_corpus_is_broad_and_every_file_is_listed():
    files = {p.name for p in CORPUS.glob("*.json")} - {"SOURCES.json"}
    assert files == {e["file"] for e in MANIFEST}
    assert len(MANIFEST) >= 70
    assert len({e["model_type"] for e in MANIFEST}) >= 50
    read = [e for e in MANIFEST if "refused" not in e["expected"]]
    assert len(read) >= 50
    assert len({e["model_type"] for e in read}) >= 30


@pytest.mark.parametrize("entry", MANIFEST, ids=ids)
def test_every_file_names_where_it_was_copied_from(entry):
    source = entry["source"]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", source["repo"]) and source["path"], source
    assert COMMIT.fullmatch(source["commit"]) and source["what"].strip(), source


@pytest.mark.parametrize("entry", [e for e in MANIFEST if "refused" not in e["expected"]], ids=ids)
def test_a_real_config_reads_into_the_hand_worked_groups(entry):
    expected = entry["expected"]
    read = kv_config.read_config(config_of(entry))
    assert read["errors"] == []
    assert read["groups"] == expected["groups"]
    assert read["context_window"] == expected["context_window"]
    # Flagged only where a reader should look: a window past the context, a quantisation not applied.
    assert [f["field"] for f in read["flags"]] == expected["flags"]
    per_token = kv_layers.cache_bytes(read["groups"], 1, 1, {"kv_dtype": "fp16"})["per_token_bytes"]
    assert per_token == expected["per_token_bytes"], expected["worked"]


@pytest.mark.parametrize("entry", [e for e in MANIFEST if "refused" in e["expected"]], ids=ids)
def test_a_config_with_keys_not_modelled_is_refused_with_the_keys_named(entry):
    read = kv_config.read_config(config_of(entry))
    assert [e["field"] for e in read["errors"]] == entry["expected"]["refused"]
    assert read["groups"] == [] or read["errors"]
