"""The two config readers agree on any input: every case of the shared hostile corpus (tests/data/hostile-configs.json),
every real file of tests/data/configs/ and every golden config, plus NaN / Infinity values and 2 MB files made here,
read by formulas/kv_config.py and by static/js/calculator/kv-config.js in Chromium, compared field by field (groups,
the one-formula numbers, errors with their messages, flags, keys used, weights, what each engine caches) and through
kv_layers / kv-layers.js to the bytes. The page's own paste path (model.js keeps only the relevant keys) reads the
same as the whole file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formulas import kv_config, kv_layers

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = json.loads((ROOT / "tests/data/hostile-configs.json").read_text(encoding="utf-8"))["cases"]
CORPUS = ROOT / "tests/data/configs"
GOLDEN = json.loads((ROOT / "static/data/kv_golden.json").read_text(encoding="utf-8"))
STORAGE = {"images": 2, "block_size": 16}  # two images a request, paged blocks: every term in play
TOKENS, SEQUENCES = 1000, 2
FIELDS = ("groups", "naive", "errors", "flags", "used", "weights", "context_window", "state_dtype", "model_type")

JS_READ = (
    """async ({ texts, objects }) => {
  const C = await import('/static/js/calculator/kv-config.js');
  const L = await import('/static/js/calculator/kv-layers.js');
  const M = await import('/static/js/calculator/model.js');
  const t = await (await fetch('/static/data/config-keys.json')).json();
  const bytes = (groups, storage, tokens, sequences) => {
    try {
      const b = L.cacheBytes(groups, tokens, sequences, storage);
      return [b.perTokenBytes, b.sequenceBytes, b.totalBytes, b.perImageBytes];
    } catch (e) { if (e instanceof L.KvInputError) return `error ${e.field}`; throw e; }
  };
  const one = (config) => {
    const r = C.readConfig(config, t);
    const page = C.isObject(config) ? C.readConfig(M.relevantConfig(config, t), t) : r;
    return {
      groups: r.groups, naive: r.naive, errors: r.errors, flags: r.flags, used: r.used, weights: r.weights,
      context_window: r.contextWindow, state_dtype: r.stateDtype, model_type: r.modelType,
      bytes: r.errors.length ? null : bytes(r.groups, STORAGE, TOKENS, SEQUENCES),
      engines: r.engines.map((e) => [e.engine, e.source, e.groups, e.storage || null,
        e.groups ? bytes(e.groups, e.storage || {}, TOKENS, 1) : null]),
      page_same: JSON.stringify(page) === JSON.stringify(r),
    };
  };
  return [...texts.map((text) => one(M.parseJson(text))), ...objects.map(one)];
}""".replace("STORAGE", json.dumps(STORAGE))
    .replace("TOKENS", str(TOKENS))
    .replace("SEQUENCES", str(SEQUENCES))
)


def py_bytes(groups: list, storage: dict, tokens: int, sequences: int):
    try:
        b = kv_layers.cache_bytes(groups, tokens, sequences, storage)
    except kv_layers.KvInputError as e:
        return f"error {e.field}"
    return [b["per_token_bytes"], b["sequence_bytes"], b["total_bytes"], b["per_image_bytes"]]


def py_read(config) -> dict:
    r = kv_config.read_config(config)
    out = {k: r[k] for k in FIELDS}
    out["bytes"] = None if r["errors"] else py_bytes(r["groups"], STORAGE, TOKENS, SEQUENCES)
    out["engines"] = [
        [
            e["engine"],
            e["source"],
            e["groups"],
            e.get("storage"),
            e["groups"] and py_bytes(e["groups"], e.get("storage") or {}, TOKENS, 1),
        ]
        for e in r["engines"]
    ]
    return out


def two_megabyte_files() -> dict[str, str]:
    """Files a JSON corpus should not ship: past the page's 1 MiB paste limit, still read the same by both."""
    layers = 150_000
    return {
        "2mb-string-value": json.dumps(
            {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "junk": "x" * 2_000_000}
        ),
        "2mb-layer-types": json.dumps(
            {
                "num_hidden_layers": layers,
                "num_attention_heads": 4,
                "hidden_size": 256,
                "layer_types": ["full_attention"] * layers,
            }
        ),
        "2mb-kv-heads-list": json.dumps(
            {"num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 256, "num_key_value_heads": [2] * 300_000}
        ),
    }


NON_FINITE = {  # values JSON cannot hold; the browser gets them as they are, through Playwright
    "nan-layers": {"num_hidden_layers": float("nan"), "num_attention_heads": 4, "hidden_size": 256},
    "infinite-window": {
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "sliding_window": float("inf"),
    },
    "negative-infinite-heads": {"num_hidden_layers": 2, "num_attention_heads": float("-inf"), "hidden_size": 256},
    "nan-in-layer-list": {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "num_key_value_heads": [2, float("nan")],
    },
}


def all_texts() -> dict[str, str]:
    texts = {f"hostile:{c['id']}": json.dumps(c["config"], ensure_ascii=False) for c in HOSTILE}
    for path in sorted(CORPUS.glob("*.json")):
        if path.name != "SOURCES.json":
            texts[f"corpus:{path.name}"] = path.read_text(encoding="utf-8")
    for kind in ("config_cases", "config_error_cases", "config_flag_cases"):
        for case in GOLDEN[kind]:
            if "config_json" in case and finite(case["config_json"]):
                texts[f"golden:{case['id']}"] = json.dumps(case["config_json"])
    return {**texts, **two_megabyte_files()}


def finite(config) -> bool:
    try:
        json.dumps(config, allow_nan=False)
    except ValueError:
        return False
    return True


def all_objects() -> dict:
    """Inputs with NaN or Infinity, handed to the browser as values (JSON.parse would refuse the text)."""
    golden = {
        f"golden:{case['id']}": case["config_json"]
        for kind in ("config_cases", "config_error_cases", "config_flag_cases")
        for case in GOLDEN[kind]
        if "config_json" in case and not finite(case["config_json"])
    }
    return {**NON_FINITE, **golden}


@pytest.fixture
def js_read(page, static_url):
    page.goto(static_url + "/static/data/config-keys.json")
    return lambda texts, objects: page.evaluate(JS_READ, {"texts": texts, "objects": objects})


def test_the_hostile_corpus_is_broad():
    ids = [c["id"] for c in HOSTILE]
    assert len(ids) == len(set(ids)) >= 70
    read = [kv_config.read_config(c["config"]) for c in HOSTILE]
    assert sum(1 for r in read if r["errors"]) >= 50  # most are refused, each by the key it is about


def test_both_readers_agree_on_every_input_field_by_field(js_read):
    texts, objects = all_texts(), all_objects()
    got = js_read(list(texts.values()), list(objects.values()))
    names = [*texts, *objects]
    expected = [py_read(json.loads(t)) for t in texts.values()] + [py_read(c) for c in objects.values()]
    assert len(got) == len(expected) >= 200
    mismatches = [
        (name, field, e[field], g[field])
        for name, e, g in zip(names, expected, got, strict=True)
        for field in (*FIELDS, "bytes", "engines")
        if e[field] != g[field]
    ]
    assert mismatches == [], mismatches[:5]
    assert [n for n, g in zip(names, got, strict=True) if not g["page_same"]] == []


def test_every_error_names_a_key_of_the_file_once(js_read):
    """One message per key: a bad list is one error, not one per entry; the field is a key of the file (or the
    file itself), never an internal name such as groups[0]."""
    texts = {n: t for n, t in all_texts().items() if n.startswith("hostile:") or n.startswith("2mb")}
    for name, text in texts.items():
        errors = kv_config.read_config(json.loads(text))["errors"]
        fields = [e["field"] for e in errors]
        assert len(fields) == len(set(fields)), (name, fields)
        assert not any(f.startswith("groups") for f in fields), (name, fields)
