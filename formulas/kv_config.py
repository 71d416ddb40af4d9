"""A Hugging Face config.json read into the calculator's layer groups (formulas.kv_layers), every value with
the key it came from, every key it cannot interpret named as an error (never a silent default).

Each layer gets a kind from `layer_types` when the file has one, else the way transformers' config class for
that model derives it (Gemma 2/3/3n patterns, Llama 4's no_rope_layers, Jamba's attn_layer_period/offset,
Qwen3-Next's full_attention_interval); `num_kv_shared_layers` turns the last layers into shared ones; the
per-sequence state of linear-attention / Mamba layers is sized from the config. static/js/calculator/kv-config.js
is the twin; static/data/kv_golden.json `config_cases` checks both. Rules and sources: docs/calculator.md.
"""

from __future__ import annotations

from typing import Any

TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "linear",
}
BIG = 2**30  # larger than any real layer count, head count or window: past it a value is a typo or a test


class _Reader:
    def __init__(self, config: dict):
        text = config.get("text_config")
        self.cfg = text if isinstance(text, dict) else config
        self.prefix = "text_config." if isinstance(text, dict) else ""
        self.used: list[dict] = []
        self.errors: list[dict] = []

    def error(self, key: str, message: str) -> None:
        self.errors.append({"field": self.prefix + key, "message": message})

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def whole(self, key: str, name: str, lo: int = 1, hi: int = BIG, default: Any = None, why: str = "") -> Any:
        """An integer read from `key` and recorded as used; a missing key takes `default` only when `why` says
        whose default it is, else it is an error."""
        v = self.cfg.get(key)
        if v is None:
            if why:
                self.used.append({"name": name, "key": self.prefix + key, "value": default, "default": why})
                return default
            self.error(key, f"missing: needed for {name}")
            return None
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            self.error(key, f"must be a whole number from {lo:,} to {hi:,} (got {v!r})")
            return None
        self.used.append({"name": name, "key": self.prefix + key, "value": v})
        return v


def _pattern(r: _Reader, layers: int) -> list[str] | None:
    """Each layer's kind before sharing: full, sliding, chunked or linear."""
    cfg = r.cfg
    kind = str(cfg.get("model_type", ""))
    if isinstance(cfg.get("layer_types"), list):
        types = cfg["layer_types"]
        if len(types) != layers:
            r.error("layer_types", f"has {len(types)} entries for {layers} layers (num_hidden_layers)")
            return None
        out = []
        for i, t in enumerate(types):
            if t not in TYPE_NAMES:
                r.error(f"layer_types[{i}]", f"unknown value {t!r}; known: {', '.join(TYPE_NAMES)}")
            out.append(TYPE_NAMES.get(t, "full"))
        r.used.append({"name": "layer kinds", "key": r.prefix + "layer_types", "value": _count_text(out)})
        return out
    if kind == "gemma2":
        return _every(r, layers, 2, "sliding", "full", "transformers Gemma2Config: every second layer is full")
    if kind in ("gemma3", "gemma3_text"):
        n = r.whole("sliding_window_pattern", "sliding pattern", 1, BIG, 6, "transformers Gemma3TextConfig default")
        return _every(r, layers, n or 6, "sliding", "full", f"transformers Gemma3TextConfig: every {n}th layer full")
    if kind == "gemma3n_text":
        return _every(r, layers, 5, "sliding", "full", "transformers Gemma3nTextConfig: every fifth layer full")
    if r.has("attention_chunk_size"):
        return _llama4(r, layers)
    if r.has("attn_layer_period"):
        period = r.whole("attn_layer_period", "attention layer period")
        offset = r.whole("attn_layer_offset", "attention layer offset", 0)
        if period is None or offset is None:
            return None
        return ["full" if i % period == offset else "linear" for i in range(layers)]
    if r.has("full_attention_interval"):
        n = r.whole("full_attention_interval", "full-attention interval")
        return None if n is None else _every(r, layers, n, "linear", "full", "")
    if r.has("sliding_window") and r.cfg.get("use_sliding_window") is not False:
        return ["sliding"] * layers
    if r.has("sliding_window"):
        r.used.append({"name": "sliding window off", "key": r.prefix + "use_sliding_window", "value": False})
    return ["full"] * layers


def _every(r: _Reader, layers: int, n: int, most: str, nth: str, rule: str) -> list[str]:
    out = [nth if (i + 1) % n == 0 else most for i in range(layers)]
    if rule:
        r.used.append(
            {"name": "layer kinds", "key": r.prefix + "model_type", "value": _count_text(out), "default": rule}
        )
    return out


def _llama4(r: _Reader, layers: int) -> list[str]:
    given = r.cfg.get("no_rope_layers")
    if isinstance(given, list) and given:
        if len(given) != layers:
            r.error("no_rope_layers", f"has {len(given)} entries for {layers} layers")
            return ["full"] * layers
        r.used.append(
            {"name": "RoPE (chunked) layers", "key": r.prefix + "no_rope_layers", "value": sum(map(bool, given))}
        )
        return ["chunked" if v else "full" for v in given]
    n = r.whole("no_rope_layer_interval", "NoPE interval", 1, BIG, 4, "transformers Llama4TextConfig default")
    return _every(r, layers, n or 4, "chunked", "full", "transformers Llama4TextConfig: every 4th layer NoPE, full")


def _count_text(kinds: list[str]) -> str:
    return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))


def _kv_heads(r: _Reader, layers: int, heads: int | None) -> list[int | None]:
    v = r.cfg.get("num_key_value_heads")
    if isinstance(v, list):
        if len(v) != layers or not all(isinstance(x, int) and 1 <= x <= BIG for x in v):
            r.error("num_key_value_heads", f"a per-layer list must hold {layers} whole numbers")
            return [None] * layers
        r.used.append({"name": "KV heads per layer", "key": r.prefix + "num_key_value_heads", "value": _count_text(v)})
        per_layer = v
    else:
        kv = r.whole(
            "num_key_value_heads", "KV heads", 1, BIG, heads, "transformers: equal to num_attention_heads (MHA)"
        )
        per_layer = [kv] * layers
    for kv in dict.fromkeys(per_layer):
        if heads and kv and heads % kv:
            r.error("num_key_value_heads", f"{kv} KV heads do not divide {heads} attention heads (num_attention_heads)")
    return per_layer


def _head_dim(r: _Reader, heads: int | None) -> int | None:
    if r.has("head_dim"):
        return r.whole("head_dim", "head dim", 1, 65536)
    hidden = r.whole("hidden_size", "hidden size")
    if hidden is None or not heads:
        return None
    if hidden % heads:
        r.error("hidden_size", f"{hidden} does not split over {heads} heads, and head_dim is not given")
        return None
    r.used.append({"name": "head dim", "key": r.prefix + "hidden_size / num_attention_heads", "value": hidden // heads})
    return hidden // heads


def _state(r: _Reader) -> dict | None:
    """Conv and recurrent elements per linear layer per sequence, as transformers' caches shape them."""
    if r.has("mamba_d_state"):
        inner = (r.whole("mamba_expand", "Mamba expand") or 0) * (r.whole("hidden_size", "hidden size") or 0)
        conv = inner * (r.whole("mamba_d_conv", "Mamba conv width") or 0)
        return {"conv": conv, "state": inner * (r.whole("mamba_d_state", "Mamba state size") or 0)}
    if r.has("linear_num_value_heads"):
        nk, dk = r.whole("linear_num_key_heads", "linear key heads"), r.whole("linear_key_head_dim", "linear key dim")
        nv, dv = (
            r.whole("linear_num_value_heads", "linear value heads"),
            r.whole("linear_value_head_dim", "linear value dim"),
        )
        kernel = r.whole("linear_conv_kernel_dim", "linear conv width")
        if None in (nk, dk, nv, dv, kernel):
            return None
        return {"conv": (2 * nk * dk + nv * dv) * kernel, "state": nv * dk * dv}
    r.error("layer_types", "linear-attention layers, but no mamba_* or linear_* keys to size their state")
    return None


def _layer(r: _Reader, kind: str, kv: int | None, head_dim: int | None, extra: dict) -> dict:
    if kind == "linear":
        return {"kind": "state", **extra["state"]} if extra.get("state") else {"kind": "state", "conv": 0, "state": 0}
    if extra.get("mla"):
        return {"kind": "mla", **extra["mla"]}
    g = {"kind": kind, "kv_heads": kv, "head_dim": head_dim}
    if kind == "sliding":
        g["window"] = extra.get("window")
    if kind == "chunked":
        g["chunk"] = extra.get("chunk")
    return g


def _extras(r: _Reader, kinds: list[str], context: int | None) -> dict:
    extra: dict = {}
    if r.has("kv_lora_rank"):
        extra["mla"] = {
            "latent": r.whole("kv_lora_rank", "MLA latent rank"),
            "rope_dim": r.whole("qk_rope_head_dim", "MLA RoPE dims", 0),
        }
    if "sliding" in kinds:
        extra["window"] = r.whole("sliding_window", "sliding window")
        if extra["window"] and context and extra["window"] > context:
            r.error(
                "sliding_window",
                f"window {extra['window']:,} is larger than the context {context:,} (max_position_embeddings)",
            )
    if "chunked" in kinds:
        extra["chunk"] = r.whole("attention_chunk_size", "attention chunk")
    if "linear" in kinds:
        extra["state"] = _state(r)
    return extra


def _grouped(layers: list[dict]) -> list[dict]:
    """Layers with the same parameters become one group, in first-seen order."""
    groups: dict[tuple, dict] = {}
    for g in layers:
        key = tuple(sorted(g.items()))
        groups.setdefault(key, {**g, "layers": 0})["layers"] += 1
    return [
        {"kind": g["kind"], "layers": g["layers"], **{k: v for k, v in g.items() if k not in ("kind", "layers")}}
        for g in groups.values()
    ]


def read_config(config: Any) -> dict:
    """{groups, naive, used, errors, context_window}: `errors` empty means `groups` is the whole model."""
    if not isinstance(config, dict):
        return {
            "groups": [],
            "naive": None,
            "used": [],
            "errors": [{"field": "config", "message": "not a JSON object"}],
            "context_window": None,
        }
    r = _Reader(config)
    layers = r.whole("num_hidden_layers", "layers", 1, 4096)
    heads = r.whole("num_attention_heads", "attention heads", 1, BIG)
    context = r.whole("max_position_embeddings", "context window", 1, BIG, None, "no context limit")
    if layers is None:
        return {"groups": [], "naive": None, "used": r.used, "errors": r.errors, "context_window": context}
    kv = _kv_heads(r, layers, heads)
    head_dim = _head_dim(r, heads)
    kinds = _pattern(r, layers) or ["full"] * layers
    extra = _extras(r, kinds, context)
    per_layer = [_layer(r, k, kv[i], head_dim, extra) for i, k in enumerate(kinds)]
    shared = r.whole("num_kv_shared_layers", "KV-shared layers", 0, layers - 1, 0, "no sharing")
    for i in range(layers - (shared or 0), layers):
        per_layer[i] = {"kind": "shared"}
    naive = {"layers": layers, "kv_heads": kv[0], "head_dim": head_dim}
    return {
        "groups": _grouped(per_layer),
        "naive": naive,
        "used": list({(u["name"], u["key"]): u for u in r.used}.values()),  # a key read twice is listed once
        "errors": r.errors,
        "context_window": context,
    }
