"""Each layer's kind, before sharing: full, sliding, chunked, linear (a per-sequence state) or cross (attention over
an image's positions), from `layer_types` when the file has one, else the rule of transformers' config class for
that model_type, and a cross-attention layer's positions per image. static/js/calculator/kv-patterns.js is the twin;
the sources per rule are in docs/calculator.md."""

from __future__ import annotations

from formulas.kv_reader import BIG, Reader, integral, shown

TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "linear",
}
# transformers Qwen2Config: sliding from max_window_layers on, only with use_sliding_window; MiMo is a Qwen2 model
# (vLLM models/mimo.py MiMoModel(Qwen2Model)).
QWEN_WINDOWED = ("qwen2", "qwen3", "qwen3_moe", "qwen3_vl_text", "mimo")
# transformers RecurrentGemmaConfig.layers_block_type: block_types cycled over the layers, "recurrent" a state
# layer, "attention" a local (sliding-window) one.
GRIFFIN_BLOCKS = {"recurrent": "linear", "attention": "sliding"}
GRIFFIN_DEFAULT = ["recurrent", "recurrent", "attention"]
# transformers MllamaTextConfig.__post_init__: the cross-attention layers a file leaving the key out gets.
MLLAMA_TYPES = ("mllama", "mllama_text_model")
MLLAMA_CROSS_DEFAULT = [3, 8, 13, 18, 23, 28, 33, 38]


def count_text(kinds: list) -> str:
    return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))


def _every(r: Reader, layers: int, n: int, most: str, nth: str, rule: str) -> list[str]:
    out = [nth if (i + 1) % n == 0 else most for i in range(layers)]
    if rule:
        r.note("layer kinds", "model_type", count_text(out), rule)
    return out


def _from_layer_types(r: Reader, layers: int) -> list[str] | None:
    """One error for a bad list, naming the first bad entry and how many there are."""
    types = r.get("layer_types")
    if not isinstance(types, list):
        r.error("layer_types", f"must be a list of {layers:,} layer kinds (got {shown(types)})")
        return None
    if len(types) != layers:
        r.error("layer_types", f"has {len(types):,} entries for {layers:,} layers (num_hidden_layers)")
        return None
    bad = [i for i, t in enumerate(types) if not isinstance(t, str) or t not in TYPE_NAMES]
    if bad:
        r.error(
            "layer_types",
            f"{len(bad):,} unknown {'entry' if len(bad) == 1 else 'entries'}, "
            f"the first layer_types[{bad[0]}] = {shown(types[bad[0]])}; "
            f"known: {', '.join(TYPE_NAMES)}",
        )
        return None
    out = [TYPE_NAMES[t] for t in types]
    r.note("layer kinds", "layer_types", count_text(out))
    return out


def _llama4(r: Reader, layers: int) -> list[str] | None:
    given = r.get("no_rope_layers")
    if isinstance(given, list) and given:
        if len(given) != layers or any(integral(v) not in (0, 1) for v in given):
            r.error("no_rope_layers", f"must be a list of {layers:,} entries, each 0 or 1")
            return None
        r.note("RoPE (chunked) layers", "no_rope_layers", sum(1 for v in given if integral(v) == 1))
        return ["chunked" if integral(v) == 1 else "full" for v in given]
    n = r.whole("no_rope_layer_interval", "NoPE interval", 1, BIG, 4, "transformers Llama4TextConfig default")
    return _every(
        r, layers, n or 4, "chunked", "full", f"transformers Llama4TextConfig: every {n or 4}th layer NoPE, full"
    )


def _gemma3(r: Reader, layers: int, default: int, rule: str) -> list[str]:
    if not r.family:
        r.flag(
            "sliding_window_pattern", "no model_type: read as transformers' Gemma 3 reads it (every n-th layer full)"
        )
    n = r.whole("sliding_window_pattern", "sliding pattern", 1, BIG, default, f"{rule} default")
    return _every(r, layers, n or default, "sliding", "full", f"{rule}: every {n or default}th layer full")


def _qwen_windows(r: Reader, layers: int) -> list[str]:
    """transformers Qwen2Config / Qwen3Config: the window applies only with use_sliding_window, and then from
    layer max_window_layers on (Qwen2-MoE: odd layers below it)."""
    if r.get("use_sliding_window") is not True:
        if r.has("sliding_window"):
            why = "" if r.get("use_sliding_window") is False else "transformers Qwen2Config default: False"
            r.note("sliding window off", "use_sliding_window", False, why)
        return ["full"] * layers
    start = r.whole("max_window_layers", "first sliding layer", 0, layers, 28, "transformers Qwen2Config default")
    if r.family == "qwen2_moe":
        return ["sliding" if i % 2 == 0 and i < start else "full" for i in range(layers)]
    return ["sliding" if i >= start else "full" for i in range(layers)]


def _jamba(r: Reader, layers: int) -> list[str] | None:
    """transformers JambaConfig: attention where i % attn_layer_period == attn_layer_offset, and it raises when
    the offset is not below the period (no layer would be attention)."""
    period = r.whole("attn_layer_period", "attention layer period")
    offset = r.whole("attn_layer_offset", "attention layer offset", 0)
    if period is None or offset is None:
        return None
    if offset >= period:
        r.error(
            "attn_layer_offset", f"{offset:,} must be below attn_layer_period ({period:,}), as JambaConfig requires"
        )
        return None
    return ["full" if i % period == offset else "linear" for i in range(layers)]


def _default_blocks_agree(r: Reader) -> bool:
    """The private _block_types that transformers 4.x wrote into RecurrentGemma files; 5.23 does not read it and
    takes the default pattern, so a file whose _block_types differs from that default is refused, not guessed."""
    old = r.get("_block_types")
    if old is None or old == GRIFFIN_DEFAULT:
        return True
    r.error(
        "_block_types",
        f"{shown(old)} is not the default pattern transformers 5.23 reads instead (it ignores "
        "_block_types); set block_types",
    )
    return False


def _griffin(r: Reader, layers: int) -> list[str] | None:
    """RecurrentGemma (Griffin): block_types repeated over the layers (RecurrentGemmaConfig.layers_block_type)."""
    blocks = r.get("block_types")
    why = ""
    if blocks is None and not _default_blocks_agree(r):
        return None
    if blocks is None:
        blocks, why = GRIFFIN_DEFAULT, "transformers RecurrentGemmaConfig default"
    if (
        not isinstance(blocks, list)
        or not blocks
        or any(not isinstance(b, str) or b not in GRIFFIN_BLOCKS for b in blocks)
    ):
        r.error("block_types", f"must be a list of {', '.join(GRIFFIN_BLOCKS)} (got {shown(blocks)})")
        return None
    out = [GRIFFIN_BLOCKS[blocks[i % len(blocks)]] for i in range(layers)]
    r.note("layer kinds (block_types repeated)", "block_types", count_text(out), why)
    return out


def _cross_layers(r: Reader, layers: int, kinds: list[str]) -> list[str] | None:
    """Mllama: the layers listed in cross_attention_layers attend to the image's positions, not the text's
    (transformers MllamaTextModel builds a MllamaCrossAttentionDecoderLayer there, self-attention elsewhere)."""
    given = r.get("cross_attention_layers")
    if given is None and layers <= max(MLLAMA_CROSS_DEFAULT):
        r.error(
            "cross_attention_layers",
            f"missing, and MllamaTextConfig's default [3, 8, …, 38] needs more than {layers} layers",
        )
        return None
    if given is None:
        given = MLLAMA_CROSS_DEFAULT
        r.flag("cross_attention_layers", "missing: transformers MllamaTextConfig's default [3, 8, …, 38] is used")
    if not isinstance(given, list) or any(integral(i) is None or not 0 <= integral(i) < layers for i in given):
        r.error("cross_attention_layers", f"must be a list of layer numbers from 0 to {layers - 1:,}")
        return None
    cross = {integral(i) for i in given}
    out = ["cross" if i in cross else k for i, k in enumerate(kinds)]
    why = "" if r.has("cross_attention_layers") else "transformers MllamaTextConfig default"
    r.note("cross-attention layers", "cross_attention_layers", len(cross), why)
    return out


def tokens_per_image(r: Reader) -> int | None:
    """Mllama's cached positions per image: max_num_tiles tiles of (image_size // patch_size)² + 1 patches each
    (transformers MllamaVisionModel.num_patches; the projected states keep every tile of every image)."""
    vision = r.top.get("vision_config")
    if not isinstance(vision, dict):
        message = "missing or not an object: needed for the cross-attention layers' positions per image"
        r.errors.append({"field": "vision_config", "message": message})  # a top-level key, not the text part's
        return None
    sub = Reader(vision, r.family)
    sub.prefix = "vision_config."
    defaults = "transformers MllamaVisionConfig default"
    size = sub.whole("image_size", "image size", 1, 65536, 448, defaults)
    patch = sub.whole("patch_size", "patch size", 1, 65536, 14, defaults)
    tiles = sub.whole("max_num_tiles", "tiles per image", 1, 64, 4, defaults)
    r.errors += sub.errors
    r.used += sub.used
    if None in (size, patch, tiles):
        return None
    per_image = tiles * ((size // patch) ** 2 + 1)
    name = "positions per image (tiles × ((image_size // patch_size)² + 1))"
    r.used.append({"name": name, "key": "vision_config", "value": per_image})  # a top-level key, not the text part's
    return per_image


def _base(r: Reader, layers: int) -> list[str] | None:
    kind = r.family
    if r.get("layer_types") is not None:
        return _from_layer_types(r, layers)
    if kind == "recurrent_gemma":
        return _griffin(r, layers)
    if kind == "gemma2":
        return _every(r, layers, 2, "sliding", "full", "transformers Gemma2Config: every second layer is full")
    if kind in ("gemma3", "gemma3_text") or (r.has("sliding_window_pattern") and kind != "cohere2"):
        return _gemma3(r, layers, 6, "transformers Gemma3TextConfig")
    if kind == "cohere2":
        return _gemma3(r, layers, 4, "transformers Cohere2Config")
    if kind == "gemma3n_text":
        return _every(r, layers, 5, "sliding", "full", "transformers Gemma3nTextConfig: every fifth layer full")
    if r.has("attention_chunk_size"):
        return _llama4(r, layers)
    if r.has("attn_layer_period"):
        return _jamba(r, layers)
    if r.has("full_attention_interval"):
        n = r.whole("full_attention_interval", "full-attention interval")
        return None if n is None else _every(r, layers, n, "linear", "full", "")
    if kind in ("mamba", "falcon_mamba"):
        r.note("layer kinds", "model_type", f"{layers} linear", f"transformers {kind}: every layer a Mamba mixer")
        return ["linear"] * layers
    if kind in (*QWEN_WINDOWED, "qwen2_moe"):
        return _qwen_windows(r, layers)
    if r.has("sliding_window") and r.get("use_sliding_window") is not False:
        return ["sliding"] * layers
    if r.has("sliding_window"):
        r.note("sliding window off", "use_sliding_window", False)
    return ["full"] * layers


def layer_kinds(r: Reader, layers: int) -> list[str] | None:
    """Each layer's kind before sharing; None (with an error recorded) when the pattern cannot be read."""
    kinds = _base(r, layers)
    if kinds is not None and (r.has("cross_attention_layers") or r.family in MLLAMA_TYPES):
        return _cross_layers(r, layers, kinds)
    return kinds
