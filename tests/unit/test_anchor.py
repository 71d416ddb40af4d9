"""`kvscope bench --anchor llamacpp` (bench/anchor.py): it says plainly when llama.cpp is missing or the
wrong version, what to run instead, turns llama.cpp's token stamps into prefill and decode speed, and a
--dtypes run keeps going (and says why) when the anchor cannot run."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from bench import anchor
from bench import dtypes as bench_dtypes


@pytest.fixture
def no_llama_cpp_python(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` then raises ImportError


def test_a_missing_node_llama_cpp_is_said_with_the_command_to_install_it(tmp_path, monkeypatch, no_llama_cpp_python):
    monkeypatch.setenv("KVSCOPE_LLAMACPP_NODE", str(tmp_path / "none"))
    found, why = anchor.find_anchor()
    assert found is None
    assert why.startswith("llama.cpp is not available: node-llama-cpp 3.21.1 is not installed in")
    assert f"npm install --prefix {tmp_path / 'none'}" in why and "node-llama-cpp@3.21.1" in why
    result = anchor.run_anchor(tmp_path / "x.gguf", [1, 2], 1, [], 4, 4, 1)
    assert result == {"available": False, "why": why}


def test_another_version_than_the_pinned_one_is_refused(tmp_path, monkeypatch, no_llama_cpp_python):
    package = tmp_path / "node_modules" / "node-llama-cpp"
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"version": "3.0.0"}))
    monkeypatch.setenv("KVSCOPE_LLAMACPP_NODE", str(tmp_path))
    monkeypatch.setattr(anchor.shutil, "which", lambda name: "/usr/bin/node")
    found, why = anchor.find_anchor()
    assert found is None and "is version 3.0.0, not the pinned 3.21.1" in why
    (package / "package.json").write_text(json.dumps({"version": "3.21.1"}))
    found, why = anchor.find_anchor()
    assert found == anchor.Anchor("node-llama-cpp", str(tmp_path)) and why == ""


def test_stamps_become_prefill_and_decode_speed():
    got = anchor.timings({"tokens": [5, 6, 7], "stamps_ms": [120.0, 140.0, 160.0, 190.0]})
    assert got["prefill_ms"] == 120.0 and got["tokens"] == 3
    # the engine's own statistic (1000 / TPOT): 3 gaps in 70 ms, the 30 ms stall counted (the median gap: 20)
    assert got["decode_tokens_per_s"] == pytest.approx(1000 * 3 / 70)
    assert got["median_gap_ms"] == 20.0  # a typical token, the stall aside
    assert anchor.timings({"tokens": [], "stamps_ms": []}) == {
        "prefill_ms": None,
        "decode_tokens_per_s": None,
        "median_gap_ms": None,
        "tokens": 0,
    }


def test_the_dtypes_run_reports_why_the_anchor_did_not_run(tmp_path, capsys):
    out = tmp_path / "dtypes.json"
    args = argparse.Namespace(
        dtypes=None, anchor="llamacpp", model="fake", device="auto", prompt_lens=(24,), output_lens=(4,),
        concurrency=(2,), repeats=1, json=str(out), via_websocket=None, batching=False, class_scenario=False,
        quick=False,
    )  # fmt: skip
    assert bench_dtypes.run_dtypes(args) == 0
    report = json.loads(out.read_text())
    assert list(report["routes"]) == ["float32", "auto"]  # --anchor alone compares the default routes
    assert report["command"].endswith("--anchor llamacpp")  # the run's command says its anchor
    assert report["anchor"] == {
        "available": False,
        "why": "the llama.cpp anchor runs the bundled GGUF only (--model default)",
    }
    assert "prefill_auto_over_float32" in report["ratios"]
    assert not any(key.endswith("_over_llamacpp") for key in report["ratios"])
    assert "llama.cpp anchor: not run: the llama.cpp anchor runs the bundled GGUF only" in capsys.readouterr().out


def test_a_route_is_set_beside_llama_cpp_by_tokens_per_second_and_by_a_typical_token():
    """Both sides by the same two statistics: tokens/s over the whole answer (a stall counts) and the median
    gap between tokens (a typical token); a speed ratio either way, above 1 where ours is faster."""
    row = {"lone_decode_tokens_per_s": {"median": 100.0}, "typical_token_ms": {"median": 9.0},
           "decoder": {"name": "native"}}  # fmt: skip
    theirs = {"available": True, "lone_decode_tokens_per_s": {"median": 50.0}, "typical_token_ms": {"median": 8.1}}
    ratios = anchor.llamacpp_ratios({"auto:native": row}, theirs)
    assert ratios["lone_auto:native_over_llamacpp"]["value"] == pytest.approx(2.0)
    assert ratios["typical_auto:native_over_llamacpp"]["value"] == pytest.approx(0.9)  # their 8.1 ms over our 9
    assert ratios["typical_auto:native_over_llamacpp"]["target"] is None
    older = {"available": True, "lone_decode_tokens_per_s": {"median": 50.0}}  # a file from before the statistic
    assert anchor.llamacpp_ratios({"auto:native": row}, older)["typical_auto:native_over_llamacpp"]["value"] is None
