"""What kvscope can know about a model served by a remote OpenAI-compatible server: its facts from
the server's /v1/models and, when given, the model's config.json (KV bytes per token, computed); a
local tokenizer from the same folder; and the server's own /metrics (vLLM names), parsed."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from formulas.kv_math import kv_bytes_per_token
from model_runner.protocol.errors import UserError

NOT_VISIBLE = "not visible from outside the server"
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1, "fp8": 1}


@dataclass(frozen=True)
class RemoteFacts:
    """ModelFacts' fields for a remote model: what the server or config.json says, None otherwise."""

    name: str
    source: str  # the model id the remote server serves (what /v1/models on this proxy shows)
    remote: str  # the server's address, e.g. http://gpu-box:8000
    layers: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    params: int | None = None
    dtype: str | None = None
    bytes_per_element: float | None = None
    context_window: int | None = None
    vocab_size: int | None = None
    device: str = "remote"
    device_name: str = ""
    weights_bytes: int | None = None
    provenance: dict[str, str] = field(default_factory=dict)  # field → where the number came from

    @property
    def kv_bytes_per_token(self) -> int | None:
        parts = (self.layers, self.kv_heads, self.head_dim, self.bytes_per_element)
        return None if None in parts else kv_bytes_per_token(*parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "engine": "openai", "kv_bytes_per_token": self.kv_bytes_per_token}


def config_path(spec: str | None) -> tuple[Path | None, Path | None]:
    """(config.json, folder to look for a tokenizer in) for --engine-config FILE_OR_FOLDER."""
    if not spec:
        return None, None
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(
            f"--engine-config {spec}: no such config.json (give the model's config.json or its folder)",
            field="engine_config",
        )
    return path, path.parent


def read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--engine-config {path}: not a readable JSON file ({exc})", field="engine_config") from None
    if not isinstance(data, dict):
        raise UserError(f"--engine-config {path}: must hold a JSON object", field="engine_config")
    return data.get("text_config") if isinstance(data.get("text_config"), dict) else data


def facts_from(name: str, remote: str, config: dict[str, Any], card: dict[str, Any]) -> RemoteFacts:
    """Facts from config.json (computed) and the server's model card (`max_model_len`, vLLM)."""
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "") or None
    head_dim = config.get("head_dim") or (hidden // heads if hidden and heads else None)
    window = card.get("max_model_len") or config.get("max_position_embeddings")
    provenance = {"kv_bytes_per_token": "computed from --engine-config" if config else NOT_VISIBLE}
    if card.get("max_model_len"):
        provenance["context_window"] = "reported by the server (max_model_len)"
    elif window:
        provenance["context_window"] = "computed from --engine-config"
    return RemoteFacts(
        name=name,
        source=name,
        remote=remote,
        layers=config.get("num_hidden_layers"),
        attention_heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        hidden_size=hidden,
        dtype=dtype,
        bytes_per_element=DTYPE_BYTES.get(dtype) if dtype else None,
        context_window=int(window) if window else None,
        vocab_size=config.get("vocab_size"),
        device_name=f"remote server at {remote}",
        provenance=provenance,
    )


def load_tokenizer(folder: Path | None):
    """A local HFTokenizer when the --engine-config folder holds a tokenizer with a chat template, else None."""
    if folder is None or not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer  # late: a remote engine without a tokenizer never imports it

    from model_runner.text.tokenizer import HFTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise UserError(f"--engine-config {folder}: the tokenizer there does not load ({exc})", field="engine_config")
    if not tok.chat_template:
        return None  # its token counts would not match what the server renders
    eos = {tok.eos_token_id} if isinstance(tok.eos_token_id, int) else set()
    return HFTokenizer(tok, eos)


# ---- the server's /metrics ----------------------------------------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
# Our key → the metric names that carry it (vLLM v1 first, then older names).
SERVER_METRICS = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
}


def parse_metrics(text: str) -> dict[str, float]:
    """The server's figures we show, each summed over its label sets; absent names stay absent."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    out = {}
    for key, names in SERVER_METRICS.items():
        found = next((sums[n] for n in names if n in sums), None)
        if found is not None:
            out[key] = found
    return out
