"""The cost model, one home per figure: FLOPs of a prefill and of a decode step, the bytes a step reads
(the weights as their route stores them, the KV cache), and the tokens/s definitions. The model's
`Shape` is read from the loaded model itself; static/js/shared/cost.js mirrors every formula here and
static/data/cost_golden.json holds the cases both must reproduce (tests/unit/test_cost.py, tests/browser/test_cost_js.py).

Tokens/s: decode tokens/s = (n - 1) / (t_last - t_first) over a request's token stamps, the one definition.
1000 / TPOT is a different figure: TPOT = (E2E - TTFT) / (n - 1) also counts the time from the last token
to the request's end, so the page does not call it tokens/s."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from formulas.kv_math import kv_bytes_per_token

ROUTES = ("float32", "bfloat16", "float16", "int4", "int8")
FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# As model_runner/loading/quantize.py stores and runs the quantized routes (tests/unit/test_cost.py checks they agree):
INT4_GROUP = 32  # inputs per scale and minimum (the GGUF's Q4_1 block)
SCALE_BYTES = 2  # the int4 scales and minimums and the int8 row scales are bfloat16
FLOAT_ROWS = 16  # a call of this many rows or more runs on float32 weights where the route keeps them
RESCORED = 32  # the quantized head's int8 pass, then this many candidates per row scored again in float32


@dataclass(frozen=True)
class Shape:
    """What the formulas need from the model, counted from its layers as they run.

    `matmul_params` are the weights of the layers' linear layers (the LM head apart), each multiplied
    once per token; `quantized_params` of them sit in the route's int4/int8 kernel (`quantized_rows`
    output rows, one int8 scale each), and with `float_prefill` (int4 under AVX2) they also keep their
    float32 weights for calls of FLOAT_ROWS rows or more; `other_params` are norms and biases, read but
    not multiplied. The head multiplies vocab x hidden weights per row of logits: in the float dtype on a
    float route, else an int8 pass plus RESCORED float32 rows (model_runner/loading/quantize.py
    RescoredHead); `tied_embeddings` says its float weights are the embedding's own tensor."""

    route: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    bytes_per_element: int  # the float dtype's: embedding, norms, float layers and the KV cache
    matmul_params: int
    quantized_params: int
    quantized_rows: int
    other_params: int
    tied_embeddings: bool
    float_prefill: bool = False

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {self.route!r}")
        if self.route in FLOAT_BYTES and self.quantized_params:
            raise ValueError(
                f"a {self.route} route holds no quantized weights, got quantized_params={self.quantized_params}"
            )
        if self.float_prefill and self.route != "int4":
            raise ValueError(
                f"only the int4 route keeps float32 weights for prefill, got float_prefill on {self.route}"
            )

    @property
    def quantized(self) -> bool:
        return self.route not in FLOAT_BYTES

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def non_embedding_params(self) -> int:
        """Every weight but the embedding and the LM head (the scaling-law convention): 106.2M for SmolLM2-135M."""
        return self.matmul_params + self.other_params

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.bytes_per_element)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- FLOPs ------------------------------------------------------------------------------------------


def attention_flops(shape: Shape, queries: int, keys: float) -> float:
    """Scores (q . k) and the weighted sum of values: 2 x head dim FLOPs each, per query-key pair, head and layer."""
    return 4 * shape.layers * shape.attention_heads * shape.head_dim * queries * keys


def prefill_flops(shape: Shape, tokens: int) -> int:
    """A prefill of `tokens` positions: 2 x the multiplied weights per position, causal attention
    (position i attends to i + 1 keys: T(T+1)/2 pairs), and ONE row of logits (the engine keeps the last)."""
    _positive("tokens", tokens)
    pairs = tokens * (tokens + 1) // 2
    return 2 * shape.matmul_params * tokens + attention_flops(shape, 1, pairs) + head_flops(shape, 1)


def decode_flops(shape: Shape, context: float) -> float:
    """One decode token at `context` cached positions: 2 x (the layers' weights + the head), plus attention
    over the context and itself."""
    _at_least_zero("context", context)
    return 2 * shape.matmul_params + head_flops(shape, 1) + attention_flops(shape, 1, context + 1)


def head_flops(shape: Shape, logits_rows: int, decode: bool = False) -> int:
    """Logits: 2 x vocab x hidden per row, and on a quantized route the RESCORED candidates again in float32
    (a prompt's call of FLOAT_ROWS rows or more runs the float32 GEMM alone; a decode step never does)."""
    rescored = shape.quantized and not _prompt_rows(logits_rows, decode)
    return 2 * logits_rows * (shape.embedding_params + (RESCORED * shape.hidden_size if rescored else 0))


# ---- bytes a step reads -----------------------------------------------------------------------------


def quantized_bytes(shape: Shape) -> int:
    """The route's kernel weights as stored: int4 packs two weights a byte and keeps a bfloat16 scale and
    minimum per group of 32 inputs (Q4_1); int8 keeps a byte a weight and a bfloat16 scale per output row."""
    if shape.route == "int4":
        return shape.quantized_params // 2 + (shape.quantized_params // INT4_GROUP) * 2 * SCALE_BYTES
    if shape.route == "int8":
        return shape.quantized_params + shape.quantized_rows * SCALE_BYTES
    return 0


def _prompt_rows(rows: int, decode: bool) -> bool:
    """Whether a call runs on the float32 weights: a prompt's FLOAT_ROWS rows or more; a decode step's rows,
    however many requests share it, stay on the kernels (model_runner/loading/quantize.py, kernel_step)."""
    return rows >= FLOAT_ROWS and not decode


def layer_bytes_read(shape: Shape, rows: int, decode: bool = False) -> int:
    """The layers' weights a call of `rows` positions reads: float ones as they are; the kernel's as stored,
    or their float32 copies where the route keeps them for a prompt's calls of FLOAT_ROWS rows or more."""
    floats = (shape.matmul_params - shape.quantized_params + shape.other_params) * shape.bytes_per_element
    if shape.float_prefill and _prompt_rows(rows, decode):
        return floats + shape.quantized_params * shape.bytes_per_element
    return floats + quantized_bytes(shape)


def head_reads_whole_float(shape: Shape, logits_rows: int, decode: bool = False) -> bool:
    return not shape.quantized or _prompt_rows(logits_rows, decode)


def head_bytes_read(shape: Shape, logits_rows: int, decode: bool = False) -> int:
    """The head as it runs: its float weights whole (a float route, or FLOAT_ROWS rows or more), else the int8
    pass (a byte a weight, a bfloat16 scale a row) and RESCORED float32 rows for each row of logits."""
    if head_reads_whole_float(shape, logits_rows, decode):
        return _embedding_bytes(shape)
    rescored = logits_rows * RESCORED * shape.hidden_size * shape.bytes_per_element
    return shape.embedding_params + shape.vocab_size * SCALE_BYTES + rescored


def weight_bytes_read(shape: Shape, tokens: int = 1, logits_rows: int | None = None, decode: bool = False) -> int:
    """Bytes of weights one forward pass over `tokens` new positions reads, making `logits_rows` rows of logits
    (one per token unless given): every layer's weights once as it runs, the head, and one embedding row per
    token (the rest of the embedding is not touched, unless the head reads it whole as its own weights)."""
    _positive("tokens", tokens)
    logits_rows = tokens if logits_rows is None else logits_rows
    _positive("logits_rows", logits_rows)
    whole = shape.tied_embeddings and head_reads_whole_float(shape, logits_rows, decode)
    rows = 0 if whole else tokens * shape.hidden_size * shape.bytes_per_element
    return layer_bytes_read(shape, tokens, decode) + head_bytes_read(shape, logits_rows, decode) + rows


def weight_bytes_held(shape: Shape) -> int:
    """Bytes the weights occupy in memory (facts.weights_bytes counts the same tensors: tests/unit/test_cost.py
    checks they agree): the layers as stored (and their float32 copies with float_prefill), the embedding, the
    head's own float weights if untied, and on a quantized route the head's int8 copy with its scales."""
    layers = layer_bytes_read(shape, 1)
    if shape.float_prefill:
        layers += shape.quantized_params * shape.bytes_per_element
    head = 0 if shape.tied_embeddings else _embedding_bytes(shape)
    if shape.quantized:
        head += shape.embedding_params + shape.vocab_size * SCALE_BYTES
    return layers + _embedding_bytes(shape) + head


def kv_bytes_read(shape: Shape, context: float) -> float:
    """Keys and values a decode step reads: every cached position of every layer."""
    _at_least_zero("context", context)
    return shape.kv_bytes_per_token * context


def prefill_bytes(shape: Shape, tokens: int) -> int:
    """A prefill's traffic: the weights once (one embedding row per position, one row of logits) and the
    prompt's keys and values written."""
    return weight_bytes_read(shape, tokens, logits_rows=1) + shape.kv_bytes_per_token * tokens


def decode_step_bytes(shape: Shape, batch: int, context: float) -> float:
    """A decode step of `batch` sequences at `context` positions each: the weights once for all of them,
    each sequence's KV cache."""
    _positive("batch", batch)
    return weight_bytes_read(shape, batch, decode=True) + batch * kv_bytes_read(shape, context)


# ---- the roofline ------------------------------------------------------------------------------------


def attainable_flops_s(intensity: float, peak_flops_s: float, bandwidth_bytes_s: float) -> float:
    """The roof above a point of `intensity` FLOPs per byte: the bandwidth's slope left of the ridge, the peak right of it."""
    return min(peak_flops_s, bandwidth_bytes_s * intensity)


# ---- tokens per second ------------------------------------------------------------------------------


def decode_tokens_per_s(token_times_s: list[float]) -> float | None:
    """(n - 1) / (t_last - t_first): the tokens after the first over the time they took; None below two tokens."""
    if len(token_times_s) < 2 or token_times_s[-1] <= token_times_s[0]:
        return None
    return (len(token_times_s) - 1) / (token_times_s[-1] - token_times_s[0])


def _embedding_bytes(shape: Shape) -> int:
    return shape.embedding_params * shape.bytes_per_element


def _positive(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a whole number of at least 1, got {value!r}")


def _at_least_zero(field: str, value: float) -> None:
    """A context may be a mean over a run's steps, so a fraction is allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{field} must be a number of at least 0, got {value!r}")
