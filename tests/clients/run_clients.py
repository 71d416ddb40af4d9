"""`make test-clients`: the pinned real clients (in .venv-clients, kept out of .venv) run in their
default setup against a live `kvscope serve` on the bundled model, one after another: lm-eval
(local-completions with a local multiple-choice and a generate_until task, local-chat-completions),
guidellm (synchronous and concurrent profiles), LangChain (chat and completions: invoke, stream,
batch, with_structured_output) and the openai SDK (structured outputs and the Responses API too).
Each client's exit status, wall time, last output lines and what the server's /metrics counted
meanwhile are printed and written to artifacts/clients-run.json.

Run with the project's python: `python tests/clients/run_clients.py --clients-python .venv-clients/bin/python`."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODEL = "SmolLM2-135M-Instruct"
COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def scrape(url: str) -> dict[str, float]:
    """The /metrics counters summed over their labels."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def wait_ready(url: str, server: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"kvscope serve exited with {server.returncode}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("kvscope serve did not become ready")


def tokenizer_folder() -> str:
    """The bundled model's converted copy (config and tokenizer): guidellm's synthetic prompts count tokens with it."""
    sys.path.insert(0, str(ROOT))
    from model_runner.loading.loader import cache_root, find_default_gguf

    return str(cache_root() / f"smollm2-135m-instruct-q4_1-{find_default_gguf().stat().st_size}")


def client_bin_dir(clients_python: str) -> Path:
    """The clients' venv bin folder as an absolute path: each client runs in another working folder, so a
    relative `.venv-clients/bin/python` must be anchored at the caller's folder first. absolute(), not
    resolve(): the venv's python is a symlink to the system one, whose folder has no lm_eval."""
    return Path(clients_python).expanduser().absolute().parent


def runs(bin_dir: Path, url: str, out: Path) -> list[tuple[str, list[str], Path]]:
    """(what, command, working folder) for each client, in their default setup."""
    lm_eval, guidellm, python = str(bin_dir / "lm_eval"), str(bin_dir / "guidellm"), str(bin_dir / "python")
    tasks = HERE / "lm_eval_tasks"
    tokenizer = tokenizer_folder()
    data = "kind=synthetic_text,prompt_tokens=64,output_tokens=16"
    guide = [guidellm, "run", "--backend", f"kind=openai_http,target={url}", "--data", data]
    guide += ["--tokenizer", f"kind=huggingface_auto,model={tokenizer}", "--disable-console-interactive"]
    return [
        (
            "lm-eval local-completions: kvscope_mc (multiple choice) and kvscope_gen (generate_until), --batch_size 4",
            [
                lm_eval,
                "--model",
                "local-completions",
                "--model_args",
                f"model={MODEL},base_url={url}/v1/completions",
                "--tasks",
                "kvscope_mc,kvscope_gen",
                "--include_path",
                ".",
                "--batch_size",
                "4",
                "--limit",
                "8",
                "--output_path",
                str(out / "lm-eval-completions"),
                "--log_samples",
            ],
            tasks,
        ),
        (
            "lm-eval local-chat-completions --apply_chat_template: kvscope_gen",
            [
                lm_eval,
                "--model",
                "local-chat-completions",
                "--model_args",
                f"model={MODEL},base_url={url}/v1/chat/completions",
                "--apply_chat_template",
                "--tasks",
                "kvscope_gen",
                "--include_path",
                ".",
                "--limit",
                "4",
            ],
            tasks,
        ),
        (
            "guidellm synchronous, 6 requests of 64 prompt / 16 output tokens",
            [
                *guide,
                "--profile",
                "kind=synchronous",
                "--constraint",
                "kind=max_requests,count=6",
                "--output",
                f"kind=json,path={out / 'guidellm-synchronous.json'}",
            ],
            out,
        ),
        (
            "guidellm concurrent (4 streams), 12 requests of 64 prompt / 16 output tokens",
            [
                *guide,
                "--profile",
                "kind=concurrent,streams=4",
                "--constraint",
                "kind=max_requests,count=12",
                "--output",
                f"kind=json,path={out / 'guidellm-concurrent.json'}",
            ],
            out,
        ),
        (
            "LangChain ChatOpenAI and OpenAI: invoke, stream, batch; ChatOpenAI.with_structured_output (Pydantic)",
            [python, str(HERE / "langchain_run.py"), url + "/v1", MODEL],
            out,
        ),
        (
            "openai SDK: models, chat (streamed with usage, logprobs), completions (n=2, two prompts), "
            "chat.completions.parse and its stream, responses.create (plain, streamed), responses.parse",
            [python, str(HERE / "sdk_run.py"), url + "/v1", MODEL],
            out,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients-python", default=str(ROOT / ".venv-clients" / "bin" / "python"))
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--serve-args", default="", help="extra `kvscope serve` arguments")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    out = ROOT / "artifacts" / "clients"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    serve = [str(ROOT / ".venv" / "bin" / "kvscope"), "serve", "--port", str(args.port), *args.serve_args.split()]
    log = open(out / "server.log", "w")
    server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    results, failed = [], 0
    try:
        wait_ready(url, server)
        for what, command, cwd in runs(client_bin_dir(args.clients_python), url, out):
            before, start = scrape(url), time.monotonic()
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
            after = scrape(url)
            counted = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k] for k in COUNTERS}
            tail = (done.stdout + done.stderr).strip().splitlines()[-14:]
            results.append(
                {
                    "client": what,
                    "rc": done.returncode,
                    "seconds": round(time.monotonic() - start, 1),
                    "metrics_delta": counted,
                    "output_tail": tail,
                }
            )
            failed += done.returncode != 0
            print(f"== {what}: rc {done.returncode}, {results[-1]['seconds']} s, /metrics counted {counted}")
            print("\n".join("   " + line for line in tail))
    finally:
        server.terminate()
        server.wait(timeout=60)
    (out / "clients-run.json").write_text(json.dumps(results, indent=1))
    print(f"{len(results) - failed} of {len(results)} clients ran to success; details in {out / 'clients-run.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
