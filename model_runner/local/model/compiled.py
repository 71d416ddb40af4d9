"""The native step's decode stretches (native.before_attention and after_attention: the norms, rotary embedding,
residuals and SiLU gate between the int4 kernels) compiled ahead of time by AOTInductor into C++ libraries, so a
decode layer runs them without Python between their kernels. Each norm's mean of squares stays an eager op: the
compiler sums 576 floats in another order than torch's reduction, which changes a bit now and then, and these
libraries must give the eager step's bits. So three pieces a layer are exported, each with a layer's weights as
inputs, at one row and with the rows dynamic: six libraries serve every layer and every decode batch. They are built in a child
process (a failed compile cannot take the server down) while the eager step serves, kept in the cache keyed by
torch, the CPU and the pieces' shapes and code, and switched in only once they give the eager stretches' bits."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from model_runner.loading import quantize
from model_runner.loading.cpu import cpu_name, cpu_vendor, isa_flags
from model_runner.loading.loader import cache_root
from model_runner.local.config import COMPILE
from model_runner.local.model import native
from model_runner.protocol.errors import UserError
from model_runner.shared.policy import POLICY_LIMITS

log = logging.getLogger("kvscope.engine")

# Vendors whose CPUs ran the compiled stretches faster than the eager ones, measured; `auto` compiles there only.
# (docs/performance.md, "The decode stretches compiled ahead of time")
MEASURED_FASTER = ("GenuineIntel",)
MAX_ROWS = 4096  # the most decode rows a library takes (a decode step has at most the policy's max_num_seqs)
# The row counts the bits check tries: small ones, around where torch's elementwise ops split a row's work among
# threads (32,768 elements: 21 rows of gate|up's half here), and the policy's largest batch.
ROWS_CHECKED = (1, 3, 8, 16, 21, 22, 33, 86, POLICY_LIMITS["max_num_seqs"][1])
BUILD_TIMEOUT_S = 900.0  # a compile of the six libraries took about a minute on 2 cores
PIECES = ("qkv", "o", "mlp")  # a decode layer's compiled pieces
LIBRARIES = tuple(f"{piece}-{width}" for width in ("1", "n") for piece in PIECES)  # each at one row and at 2 or more


@dataclass(frozen=True)
class Spec:
    """What a library is compiled for: the stretches' constants and the shapes and dtypes of one layer's inputs
    (every layer's are the same; `spec_of` checks), the rows left dynamic."""

    width: int  # the residual's width D
    head_dim: int
    qk_width: int  # q's and k's outputs, before v's, in the joined q|k|v call
    out_width: int  # attention's output a row, heads · head_dim
    eps: float  # the attention norm's epsilon
    mlp_eps: float
    norm_dtype: str
    kernels: tuple  # per call (q|k|v, o, gate|up, down): (weight shape, weight dtype, scales shape, scales dtype)

    def key(self) -> str:
        """The cache folder's name: this spec, torch, the CPU and its kernels, and the stretches' code."""
        facts = {
            "spec": asdict(self),
            "torch": torch.__version__,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": [cpu_name(), isa_flags()],
            "code": [inspect.getsource(sys.modules[__name__]), *(inspect.getsource(fn) for fn in SOURCE)],
            "constants": [str(quantize.MM_DTYPE), quantize.GROUP, MAX_ROWS],
        }
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


def _layer_spec(decoder: native.NativeLlama, layer: native.Layer) -> Spec:
    kernels = tuple(
        (tuple(weight.shape), str(weight.dtype), tuple(scales.shape), str(scales.dtype))
        for weight, scales in layer.kernels
    )
    return Spec(
        width=layer.attention_norm.weight.shape[0],
        head_dim=decoder.head_dim,
        qk_width=decoder.qk_width,
        out_width=decoder.heads * decoder.head_dim,
        eps=layer.attention_norm.eps,
        mlp_eps=layer.mlp_norm.eps,
        norm_dtype=str(layer.attention_norm.weight.dtype),
        kernels=kernels,
    )


def spec_of(decoder) -> tuple[Spec | None, str]:
    """(the spec of `decoder`'s decode stretches, "") or (None, why they do not run or cannot be compiled)."""
    if not isinstance(decoder, native.NativeLlama):
        return None, "transformers' forward runs the steps (the compiled stretches are the native step's)"
    if not decoder.all_int4:
        return None, "this route's steps do not run the int4 decode stretches (the int4 route's alone do)"
    specs = {_layer_spec(decoder, layer) for layer in decoder.layers}
    if len(specs) != 1:
        return None, "its layers differ in shape or epsilon (one library serves every layer)"
    return specs.pop(), ""


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def variance(x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm's mean of squares over the last dim, by torch's own reduction: eager, as rms_norm sums it."""
    return x.pow(2).mean(-1, keepdim=True)


def normed(x: torch.Tensor, variance: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The rest of torch's float32 rms_norm after its mean of squares, in its order (native.rms_norm)."""
    return x * torch.rsqrt(variance + eps) * weight


def qkv_piece(h, variance, norm_weight, weight, scales, cos, sin, spec: Spec):
    """before_attention after its norm's mean of squares: h [1, R, D] → q's and k's heads rotated [1, H + KV, R, d]
    and v [R, KV·d]."""
    tokens = h.shape[1]
    x = normed(h, variance, norm_weight, spec.eps).view(tokens, spec.width)
    qkv = quantize.int4_mm(x, weight, scales, h.dtype)
    qk = native.rotate(qkv[:, : spec.qk_width].view(1, tokens, -1, spec.head_dim).transpose(1, 2), cos, sin)
    return qk, qkv[:, spec.qk_width :]


def o_piece(h, out, weight, scales):
    """after_attention up to the residual: h + o(out), [1, R, D] (the kernel's bfloat16 added as it is)."""
    return h + quantize.int4_mm(out, weight, scales, quantize.MM_DTYPE).view(h.shape)


def mlp_piece(h, variance, norm_weight, gate_up, gate_up_scales, down, down_scales, spec: Spec):
    """after_attention after the MLP norm's mean of squares: h [1, R, D] → the layer's output [1, R, D]."""
    x = normed(h, variance, norm_weight, spec.mlp_eps).view(h.shape[1], spec.width)
    gate, up = quantize.int4_mm(x, gate_up, gate_up_scales, h.dtype).chunk(2, dim=-1)
    return h + quantize.int4_mm(torch.nn.functional.silu(gate) * up, down, down_scales, quantize.MM_DTYPE).view(h.shape)


# The code a library compiles or must equal, besides this module's own: a change to any builds it again.
SOURCE = (native.before_attention, native.after_attention, native.rms_norm, native.rotate, quantize.int4_mm)


def _modules(spec: Spec) -> tuple[torch.nn.Module, ...]:
    """The three pieces as modules whose inputs are a layer's tensors (its norm's weight, its kernels)."""

    class Piece(torch.nn.Module):
        def __init__(self, fn, *constants):
            super().__init__()
            self.fn, self.constants = fn, constants

        def forward(self, *tensors):
            return self.fn(*tensors, *self.constants)

    return Piece(qkv_piece, spec), Piece(o_piece), Piece(mlp_piece, spec)


def _examples(spec: Spec, rows: int) -> tuple[tuple, ...]:
    """Inputs of `rows` rows for each piece, of the spec's shapes and dtypes (their values do not matter)."""
    kernels = [
        (torch.zeros(w_shape, dtype=_dtype(w_dtype)), torch.zeros(s_shape, dtype=_dtype(s_dtype)))
        for w_shape, w_dtype, s_shape, s_dtype in spec.kernels
    ]
    h, variance = torch.zeros(1, rows, spec.width), torch.ones(1, rows, 1)
    norm, cos = torch.ones(spec.width, dtype=_dtype(spec.norm_dtype)), torch.zeros(1, 1, rows, spec.head_dim)
    qkv, o, gate_up, down = kernels
    return (
        (h, variance, norm, *qkv, cos, cos.clone()),
        (h, torch.zeros(rows, spec.out_width), *o),
        (h, variance, norm, *gate_up, *down),
    )


def build(spec: Spec, folder: Path) -> None:
    """Export each piece twice, at one row (a lone request's decode step) and with the rows dynamic from 2 to
    MAX_ROWS (an export traced at 2 rows assumes 2 or more, so one row gets a library of its own), and compile
    each into `folder`/LIBRARY.pt2 (LIBRARIES)."""
    from torch.export import Dim

    rows = Dim("rows", min=2, max=MAX_ROWS)
    dynamic = (
        ({1: rows}, {1: rows}, None, None, None, {2: rows}, {2: rows}),
        ({1: rows}, {0: rows}, None, None),
        ({1: rows}, {1: rows}, *[None] * 5),
    )
    for width, examples, shapes in (("1", _examples(spec, 1), (None,) * 3), ("n", _examples(spec, 2), dynamic)):
        for name, module, args, dims in zip(PIECES, _modules(spec), examples, shapes):
            with torch.no_grad():
                program = torch.export.export(module, args, dynamic_shapes=None if dims is None else (dims,))
            package = str(folder / f"{name}-{width}.pt2")  # forward(*tensors): the dims are its one argument's
            torch._inductor.aoti_compile_and_package(program, package_path=package)


def load(folder: Path) -> tuple[Callable, Callable]:
    """The compiled pieces in `folder`, as callables with native.before_attention's and after_attention's own
    arguments (NativeLlama.stretches): each norm's mean of squares eager, the rest in the libraries of one row or
    of any rows, by the step's."""
    # each library's runner called with its flat list of tensors: the package's own __call__ parses its input and
    # output specs and walks both trees on every call, which cost about as much again as the run itself
    runners = {
        library: torch._inductor.aoti_load_package(str(folder / f"{library}.pt2")).loader.run for library in LIBRARIES
    }

    def before_attention(h, norm, kernel, cos, sin, head_dim, qk_width):
        width = "1" if h.shape[1] == 1 else "n"
        return tuple(runners[f"qkv-{width}"]([h, variance(h), norm.weight, *kernel, cos, sin]))

    def after_attention(h, out, o_kernel, norm, gate_up_kernel, down_kernel):
        width = "1" if h.shape[1] == 1 else "n"
        (h,) = runners[f"o-{width}"]([h, out, *o_kernel])
        return runners[f"mlp-{width}"]([h, variance(h), norm.weight, *gate_up_kernel, *down_kernel])[0]

    return before_attention, after_attention


def same_bits(decoder: native.NativeLlama, stretches: tuple, rows_tried=ROWS_CHECKED) -> bool:
    """Whether `stretches` give the eager stretches' bits (values, dtypes and shapes) on the first and last layers'
    weights, on seeded inputs of each count in `rows_tried`, under this process's threads (the compiler may order
    a sum otherwise, and torch may split an op's work otherwise: the library is used only where neither shows)."""
    generator = torch.Generator().manual_seed(0)
    width, head_dim = decoder.layers[0].attention_norm.weight.shape[0], decoder.head_dim
    out_width = decoder.heads * head_dim
    eager = (native.before_attention, native.after_attention)
    with torch.inference_mode():
        for layer in (decoder.layers[0], decoder.layers[-1]):
            qkv, o, gate_up, down = layer.kernels
            for rows in rows_tried:
                # a wide range of magnitudes, as a residual has: where a sum's order would show, it shows
                h = (
                    torch.randn(1, rows, width, generator=generator)
                    * (2 * torch.randn(1, rows, width, generator=generator)).exp()
                )
                cos, sin = (torch.randn(1, 1, rows, head_dim, generator=generator) for _ in range(2))
                out = torch.randn(rows, out_width, generator=generator)
                args = (
                    (h, layer.attention_norm, qkv, cos, sin, head_dim, decoder.qk_width),
                    (h, out, o, layer.mlp_norm, gate_up, down),
                )
                for mine, theirs, inputs in zip(stretches, eager, args):
                    got, want = (torch.utils._pytree.tree_leaves(fn(*inputs)) for fn in (mine, theirs))
                    same = len(got) == len(want) and all(a.dtype == b.dtype for a, b in zip(got, want))
                    if not same or not all(torch.equal(a, b) for a, b in zip(got, want)):
                        return False
    return True


def _error_line(stderr: str) -> str | None:
    """The child's exception line (`SomeError: why`), the last one, else its last line."""
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    return (errors or lines or [None])[-1]


def _complete(folder: Path) -> bool:
    return all((folder / f"{library}.pt2").is_file() for library in LIBRARIES)


def cached_folder(spec: Spec) -> Path:
    return cache_root() / "compiled" / spec.key()


def ensure_built(spec: Spec) -> Path:
    """The folder holding `spec`'s libraries, built in a child process first where the cache has none.
    Raises RuntimeError with the child's last line when the compile fails."""
    folder = cached_folder(spec)
    if _complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix="building-"))
    try:
        (scratch / "spec.json").write_text(json.dumps(asdict(spec)))
        command = [sys.executable, "-m", "model_runner.local.model.compiled", str(scratch)]
        # the child imports this package from where this process did, installed or not
        top = str(Path(__file__).resolve().parents[3])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [top, os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"the compile failed: {_error_line(done.stderr) or f'exit {done.returncode}'}")
        try:
            scratch.replace(folder)  # whole or not at all: a later start never loads half a build
        except OSError:  # another process (a second server, a test worker) landed the same build first
            if not _complete(folder):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


@dataclass
class Compiled:
    """What /api/model says of the compiled stretches: asked (auto, on, off), state (off, compiling, on,
    failed) and why; the state and its reason change together (`now`: one assignment, read whole)."""

    asked: str
    now: tuple[str, str] = ("off", "")
    settled: threading.Event = field(default_factory=threading.Event, repr=False)  # set once not compiling

    @property
    def state(self) -> str:
        return self.now[0]

    @property
    def reason(self) -> str:
        return self.now[1]

    def to_dict(self) -> dict:
        state, reason = self.now
        return {"asked": self.asked, "state": state, "reason": reason}

    def wait(self, timeout: float = BUILD_TIMEOUT_S) -> Compiled:
        """Itself, once a compile under way has switched in or failed (or `timeout` passed)."""
        self.settled.wait(timeout)
        return self


def start(decoder, asked: str, device: torch.device) -> Compiled:
    """Compile (or load from the cache) `decoder`'s decode stretches on a thread of their own where `asked`
    (auto: on a CPU whose vendor measured faster) and they apply; the eager step serves meanwhile and the
    decoder switches once the library gives its bits. A failure leaves the eager step with one log line."""
    if asked not in COMPILE:
        raise UserError(f"--compile must be one of {', '.join(COMPILE)}, got {asked!r}", field="compile")
    status, (spec, why), vendor = Compiled(asked), spec_of(decoder), cpu_vendor()
    if asked == "off":
        status.now = ("off", "--compile off")
    elif device.type != "cpu":
        status.now = (
            "off",
            f"the compiled stretches are the CPU's ({device.type} steps run eagerly or as CUDA graphs)",
        )
    elif spec is None:
        status.now = ("off", why)
    elif asked == "auto" and vendor not in MEASURED_FASTER:
        status.now = ("off", f"auto: not measured faster on this CPU's vendor ({vendor}); --compile on tries it")
    else:
        status.now = ("compiling", "the eager step serves until the library is ready")
        threading.Thread(target=_switch, args=(decoder, spec, status), name="kvscope-compile", daemon=True).start()
        return status
    status.settled.set()
    return status


def _switch(decoder: native.NativeLlama, spec: Spec, status: Compiled) -> None:
    try:
        stretches = load(ensure_built(spec))
        if not same_bits(decoder, stretches):
            raise RuntimeError(f"the library in {cached_folder(spec)} did not give the eager stretches' bits")
    except Exception as exc:  # any failure keeps the eager step: one line, never a dead server
        status.now = ("failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        log.warning("compiled stretches not used, the eager step serves: %s", status.reason)
    else:
        decoder.stretches = stretches  # one assignment: the next step reads both stretches from it, never one of each
        status.now = ("on", f"AOTInductor's library, cached in {cached_folder(spec)}")
        log.info("compiled stretches on: %s", status.reason)
    status.settled.set()


def main(argv: list[str]) -> int:
    """The child process: build the libraries for the spec in FOLDER/spec.json into FOLDER."""
    folder = Path(argv[0])
    spec = json.loads((folder / "spec.json").read_text())
    kernels = tuple((tuple(w), w_dtype, tuple(s), s_dtype) for w, w_dtype, s, s_dtype in spec["kernels"])
    build(Spec(**{**spec, "kernels": kernels}), folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
