"""A Hugging Face config.json read into the calculator's layer groups (formulas.kv_layers), every value with the
key it came from; a key it cannot interpret is an error naming it, a key it reads outside the families it knows
is flagged, and a key that changes the cache in a way it does not model refuses the file (never a silent guess).

Key names come from one table, static/data/config-keys.json (aliases per fact, each with its families and source),
which static/js/calculator/kv-config.js reads too; tests/data/configs/ is the corpus of real files both are checked
against. Each layer's kind comes from `layer_types` when the file has one, else the rule of transformers' config
class for that model_type. Rules and sources: docs/calculator.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The repository keeps static/ at the top; an installed copy keeps it inside the app package (pyproject.toml).
_TABLE_PATHS = [
    Path(__file__).resolve().parents[1] / where / "data/config-keys.json" for where in ("static", "app/static")
]
TABLE = json.loads(next(p for p in _TABLE_PATHS if p.exists()).read_text(encoding="utf-8"))
TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "linear",
}
BIG = 2**30  # larger than any real layer count, head count or window: past it a value is a typo or a test
QWEN_WINDOWED = ("qwen2", "qwen3", "qwen3_moe", "qwen3_vl_text")  # transformers: sliding from max_window_layers on
WEIGHT_TYPES = {"bfloat16": "fp16", "float16": "fp16", "float32": "fp32"}
STATE_TYPES = {"float32": "fp32", "bfloat16": "fp16", "float16": "fp16"}
# vLLM applies mamba_ssm_dtype to the recurrent state only, the conv state keeping the model's type
# (vllm/model_executor/layers/mamba/mamba_utils.py _mamba_state_dtype); this calculator has one state type.
STATE_DTYPE_NOTE = "state element type (here the whole state; vLLM: the recurrent state only)"
# transformers Gemma3nTextConfig.num_kv_shared_layers: the default a gemma3n_text file leaving the key out takes.
GEMMA3N_SHARED_DEFAULT = 15


def _integral(v: Any) -> int | None:
    """A JSON whole number (32 or 32.0, as JavaScript reads both), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (v == v and abs(v) != float("inf") and v == int(v)):
        return None
    return int(v)


def _families_text(families: Any) -> str:
    return "every family" if families == "*" else ", ".join(families)


class _Reader:
    def __init__(self, config: dict):
        text = config.get("text_config")
        self.top = config
        self.cfg = text if isinstance(text, dict) else config
        self.prefix = "text_config." if isinstance(text, dict) else ""
        self.family = str(self.cfg.get("model_type") or config.get("model_type") or "")
        self.used: list[dict] = []
        self.errors: list[dict] = []
        self.flags: list[dict] = []

    def error(self, key: str, message: str) -> None:
        self.errors.append({"field": self.prefix + key, "message": message})

    def flag(self, key: str, message: str) -> None:
        self.flags.append({"field": self.prefix + key, "message": message})

    def get(self, key: str) -> Any:
        """The file's value at `key` ("a.b" reads inside an object), None when absent or null."""
        node: Any = self.cfg
        for part in key.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def note(self, name: str, key: str, value: Any, default: str = "") -> None:
        u = {"name": name, "key": self.prefix + key, "value": value}
        if default:
            u["default"] = default
        self.used.append(u)

    def check(self, key: str, v: Any, lo: int, hi: int) -> int | None:
        n = _integral(v)
        if n is None or not lo <= n <= hi:
            self.error(key, f"must be a whole number from {lo:,} to {hi:,} (got {json.dumps(v)})")
            return None
        return n

    def whole(self, key: str, name: str, lo: int = 1, hi: int = BIG, default: Any = None, why: str = "") -> Any:
        """An integer read from `key` and recorded as used; a missing key takes `default` only when `why` says
        whose default it is, else it is an error."""
        v = self.get(key)
        if v is None:
            if why:
                self.note(name, key, default, why)
                return default
            self.error(key, f"missing: needed for {name}")
            return None
        n = self.check(key, v, lo, hi)
        if n is not None:
            self.note(name, key, n)
        return n

    def known_for_family(self, key: str, families: Any) -> None:
        if families != "*" and self.family and self.family not in families:
            self.flag(key, f"read, though this calculator knows {key} only in {_families_text(families)} configs")

    def fact(self, fact: str, lo: int = 1, hi: int = BIG, default: Any = None, why: str = "", skip: tuple = ()) -> Any:
        """One fact from the first alias the file sets (config-keys.json order); aliases that disagree are an
        error, an alias outside its families is flagged, a missing fact takes the family's transformers default."""
        spec = TABLE["facts"][fact]
        present = [a for a in spec["aliases"] if a["key"] not in skip and self.has(a["key"])]
        if not present:
            family_default = TABLE["defaults"].get(self.family, {})
            standard = spec["standard"]
            if standard in family_default:
                self.note(spec["name"], standard, family_default[standard], family_default["source"])
                return family_default[standard]
            if why:
                self.note(spec["name"], standard, default, why)
                return default
            keys = " / ".join(a["key"] for a in spec["aliases"])
            self.error(standard, f"missing: needed for {spec['name']} (looked for {keys})")
            return None
        values = {a["key"]: self.get(a["key"]) for a in present}
        if len({json.dumps(v) for v in values.values()}) > 1:
            said = " and ".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
            self.error(present[0]["key"], f"{said} disagree about the {spec['name']}")
            return None
        first = present[0]
        self.known_for_family(first["key"], first["families"])
        return self.whole(first["key"], spec["name"], lo, hi)


def _count_text(kinds: list[str]) -> str:
    return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))


def _every(r: _Reader, layers: int, n: int, most: str, nth: str, rule: str) -> list[str]:
    out = [nth if (i + 1) % n == 0 else most for i in range(layers)]
    if rule:
        r.note("layer kinds", "model_type", _count_text(out), rule)
    return out


def _from_layer_types(r: _Reader, layers: int) -> list[str] | None:
    types = r.get("layer_types")
    if not isinstance(types, list):
        r.error("layer_types", f"must be a list of {layers} layer kinds (got {type(types).__name__})")
        return None
    if len(types) != layers:
        r.error("layer_types", f"has {len(types)} entries for {layers} layers (num_hidden_layers)")
        return None
    out = []
    for i, t in enumerate(types):
        if not isinstance(t, str) or t not in TYPE_NAMES:
            r.error(f"layer_types[{i}]", f"unknown value {json.dumps(t)}; known: {', '.join(TYPE_NAMES)}")
        out.append(TYPE_NAMES.get(t, "full") if isinstance(t, str) else "full")
    r.note("layer kinds", "layer_types", _count_text(out))
    return out


def _llama4(r: _Reader, layers: int) -> list[str]:
    given = r.get("no_rope_layers")
    if isinstance(given, list) and given:
        if len(given) != layers:
            r.error("no_rope_layers", f"has {len(given)} entries for {layers} layers")
            return ["full"] * layers
        r.note("RoPE (chunked) layers", "no_rope_layers", sum(1 for v in given if v))
        return ["chunked" if v else "full" for v in given]
    n = r.whole("no_rope_layer_interval", "NoPE interval", 1, BIG, 4, "transformers Llama4TextConfig default")
    return _every(
        r, layers, n or 4, "chunked", "full", f"transformers Llama4TextConfig: every {n or 4}th layer NoPE, full"
    )


def _gemma3(r: _Reader, layers: int, default: int, rule: str) -> list[str]:
    if not r.family:
        r.flag(
            "sliding_window_pattern", "no model_type: read as transformers' Gemma 3 reads it (every n-th layer full)"
        )
    n = r.whole("sliding_window_pattern", "sliding pattern", 1, BIG, default, f"{rule} default")
    return _every(r, layers, n or default, "sliding", "full", f"{rule}: every {n or default}th layer full")


def _qwen_windows(r: _Reader, layers: int) -> list[str]:
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


def _pattern(r: _Reader, layers: int) -> list[str] | None:
    """Each layer's kind before sharing: full, sliding, chunked or linear."""
    kind = r.family
    if r.get("layer_types") is not None:
        return _from_layer_types(r, layers)
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
        period = r.whole("attn_layer_period", "attention layer period")
        offset = r.whole("attn_layer_offset", "attention layer offset", 0)
        if period is None or offset is None:
            return None
        return ["full" if i % period == offset else "linear" for i in range(layers)]
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


def _kv_heads(r: _Reader, layers: int, heads: int | None) -> list[int | None]:
    mq = TABLE["multi_query"]
    new_falcon = r.family in mq["falcon_types"] and r.get("new_decoder_architecture") is True
    if r.get("multi_query") is True and not new_falcon:
        r.known_for_family("multi_query", mq["families"])
        r.note("KV heads (true: one, as vLLM and transformers read it)", "multi_query", 1)
        return [1] * layers
    v = r.get("num_key_value_heads")
    if isinstance(v, list):
        if len(v) != layers or any(_integral(x) is None or not 1 <= _integral(x) <= BIG for x in v):
            r.error("num_key_value_heads", f"a per-layer list must hold {layers} whole numbers")
            return [None] * layers
        per_layer = [_integral(x) for x in v]
        r.note("KV heads per layer", "num_key_value_heads", _count_text(per_layer))
    else:
        skip = ("multi_query_group_num",) if r.get("multi_query_attention") is False else ()
        kv = r.fact(
            "kv_heads", 1, BIG, heads, "equal to the attention heads (MHA), as transformers and vLLM assume", skip
        )
        if kv is None and not r.errors:
            r.error("num_key_value_heads", "missing, and no num_attention_heads to take it from")
        per_layer = [kv] * layers
    for kv in dict.fromkeys(per_layer):
        if heads and kv and heads % kv:
            r.error("num_key_value_heads", f"{kv} KV heads do not divide {heads} attention heads")
    return per_layer


def _head_dim(r: _Reader, heads: int | None) -> int | None:
    if any(r.has(a["key"]) for a in TABLE["facts"]["head_dim"]["aliases"]):
        return r.fact("head_dim", 1, 65536)
    hidden = r.fact("hidden_size")
    if hidden is None or not heads:
        return None
    if hidden % heads:
        r.error("hidden_size", f"{hidden} does not split over {heads} heads, and head_dim is not given")
        return None
    r.note("head dim", "hidden_size / num_attention_heads", hidden // heads)
    return hidden // heads


def _mamba_state(r: _Reader) -> dict | None:
    expand, conv, size = r.fact("mamba_expand"), r.fact("mamba_conv"), r.fact("mamba_state")
    hidden = r.fact("hidden_size")
    if None in (expand, conv, size, hidden):
        return None
    inner = expand * hidden
    return {"conv": inner * conv, "state": inner * size, "conv_kernel": conv}


def _state(r: _Reader) -> dict | None:
    """Conv and recurrent elements per linear layer per sequence, as transformers' caches shape them (the conv
    state keeps conv_kernel columns there; vLLM keeps conv_kernel − 1, kv_layers applies the choice)."""
    if any(r.has(a["key"]) for a in TABLE["facts"]["mamba_state"]["aliases"]):
        return _mamba_state(r)
    if r.has("linear_num_value_heads"):
        nk, dk = r.whole("linear_num_key_heads", "linear key heads"), r.whole("linear_key_head_dim", "linear key dim")
        nv = r.whole("linear_num_value_heads", "linear value heads")
        dv = r.whole("linear_value_head_dim", "linear value dim")
        kernel = r.whole("linear_conv_kernel_dim", "linear conv width")
        if None in (nk, dk, nv, dv, kernel):
            return None
        return {"conv": (2 * nk * dk + nv * dv) * kernel, "state": nv * dk * dv, "conv_kernel": kernel}
    r.error("layer_types", "linear-attention layers, but no mamba_* / state_size or linear_* keys to size their state")
    return None


def _mla(r: _Reader) -> dict | None:
    latent = r.whole("kv_lora_rank", "MLA latent rank", 1, 65536)
    rope = r.whole("qk_rope_head_dim", "MLA RoPE dims", 0, 65536)
    return None if latent is None or rope is None else {"latent": latent, "rope_dim": rope}


def _extras(r: _Reader, kinds: list[str], context: int | None) -> dict:
    extra: dict = {}
    if r.has("kv_lora_rank"):
        extra["mla"] = _mla(r)
    if "sliding" in kinds:
        extra["window"] = r.whole("sliding_window", "sliding window")
        if extra["window"] and context and extra["window"] >= context:
            r.flag("sliding_window", f"window {extra['window']:,} ≥ the context {context:,}: it never binds there")
    if "chunked" in kinds:
        extra["chunk"] = r.whole("attention_chunk_size", "attention chunk")
    if "linear" in kinds:
        extra["state"] = _state(r)
    return extra


def _layer(kind: str, kv: int | None, head_dim: int | None, extra: dict) -> dict:
    if kind == "linear":
        return {"kind": "state", **(extra.get("state") or {"conv": 0, "state": 0})}
    if extra.get("mla"):
        return {"kind": "mla", **extra["mla"]}
    g = {"kind": kind, "kv_heads": kv, "head_dim": head_dim}
    if kind == "sliding":
        g["window"] = extra.get("window")
    if kind == "chunked":
        g["chunk"] = extra.get("chunk")
    return g


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


def _refuse_unread(r: _Reader) -> None:
    """Keys that change the cache in a way this calculator does not model: the file is refused, key named."""
    for entry in TABLE["unread"]:
        v = r.get(entry["key"])
        if v is None or v is False or v == 0:
            continue
        r.error(entry["key"], f"{entry['why']}, so this calculator refuses the file rather than count it wrong")


def _flag_outside_families(r: _Reader) -> None:
    if not r.family:
        r.flag("model_type", "not given: keys are read by their names alone")
    for key, spec in TABLE["known"].items():
        if key != "layer_types" and r.has(key):
            r.known_for_family(key, spec["families"])


def _weights(r: _Reader) -> dict | None:
    """The weights' element type as the file states it: an fp8 quantization block, else torch_dtype / dtype."""
    for where in (r.top, r.cfg):
        q = where.get("quantization_config")
        if isinstance(q, dict) and q.get("quant_method") is not None:
            method = str(q["quant_method"])
            if method in TABLE["weights"]["quant_method"]:
                block = q.get("weight_block_size")
                note = f"fp8 {q.get('fmt') or ''} weights".strip()
                if isinstance(block, list):
                    note += f", one scale per {' × '.join(map(str, block))} block (not counted)"
                dtype = TABLE["weights"]["quant_method"][method]
                return {"dtype": dtype, "key": "quantization_config.quant_method", "value": method, "note": note}
            r.flag("quantization_config.quant_method", f"weights quantised as {method}: not applied, set the type")
            return None
    for where, prefix in ((r.cfg, r.prefix), (r.top, "")):
        for key in ("torch_dtype", "dtype"):
            v = where.get(key)
            if isinstance(v, str) and v in WEIGHT_TYPES:
                return {"dtype": WEIGHT_TYPES[v], "key": prefix + key, "value": v, "note": f"{v} weights"}
    return None


def _naive(r: _Reader, layers: int, kv: int | None, heads: int | None, head_dim: int | None) -> dict | None:
    """The one formula's numbers; for MLA the cache it compresses: every head's key (nope + RoPE) and value."""
    if not r.has("kv_lora_rank"):
        return {"layers": layers, "kv_heads": kv, "head_dim": head_dim}
    nope, rope, value = (r.get(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    if None in (_integral(nope), _integral(rope), _integral(value)) or not heads:
        return None
    return {"layers": layers, "kv_heads": heads, "key_dim": int(nope) + int(rope), "value_dim": int(value)}


def _shared_layers(r: _Reader, layers: int) -> int | None:
    """The last layers that reuse another's cache: num_kv_shared_layers, else Gemma3nTextConfig's default 15 for a
    gemma3n_text file, else none."""
    if r.family != "gemma3n_text" or r.has("num_kv_shared_layers"):
        return r.whole("num_kv_shared_layers", "KV-shared layers", 0, layers - 1, 0, "no sharing")
    if GEMMA3N_SHARED_DEFAULT > layers - 1:
        r.error(
            "num_kv_shared_layers",
            f"missing, and Gemma3nTextConfig's default of 15 shared layers needs more than {layers} layers",
        )
        return 0
    why = "transformers Gemma3nTextConfig default"
    return r.whole("num_kv_shared_layers", "KV-shared layers", 0, layers - 1, GEMMA3N_SHARED_DEFAULT, why)


def _refused(message: str) -> dict:
    return {
        "groups": [],
        "naive": None,
        "used": [],
        "errors": [{"field": "config", "message": message}],
        "flags": [],
        "context_window": None,
        "weights": None,
        "state_dtype": None,
        "model_type": "",
    }


def read_config(config: Any) -> dict:
    """{groups, naive, used, errors, flags, context_window, weights, state_dtype, model_type}: `errors` empty
    means `groups` is the whole model; `flags` are keys read outside the families this table knows them in."""
    if not isinstance(config, dict):
        return _refused("not a JSON object")
    if config.get("text_config") is not None and not isinstance(config["text_config"], dict):
        return _refused("text_config must be an object")
    r = _Reader(config)
    _refuse_unread(r)
    _flag_outside_families(r)
    layers = r.fact("layers", 1, 4096)
    heads = r.fact("attention_heads", 1, BIG, None, "not given: only the KV heads matter")
    context = r.fact("context", 1, BIG, None, "no context limit")
    weights, state_dtype = _weights(r), STATE_TYPES.get(str(r.get("mamba_ssm_dtype")))
    if state_dtype:
        r.note(STATE_DTYPE_NOTE, "mamba_ssm_dtype", r.get("mamba_ssm_dtype"))
    base = {"flags": r.flags, "context_window": context, "weights": weights, "state_dtype": state_dtype}
    if layers is None:
        return {"groups": [], "naive": None, "used": r.used, "errors": r.errors, "model_type": r.family, **base}
    kinds = _pattern(r, layers) or ["full"] * layers
    needs_heads = any(k != "linear" for k in kinds) and not r.has("kv_lora_rank")
    kv = _kv_heads(r, layers, heads) if needs_heads else [None] * layers
    head_dim = _head_dim(r, heads) if needs_heads else None
    extra = _extras(r, kinds, context)
    per_layer = [_layer(k, kv[i], head_dim, extra) for i, k in enumerate(kinds)]
    shared = _shared_layers(r, layers)
    for i in range(layers - (shared or 0), layers):
        per_layer[i] = {"kind": "shared"}
    return {
        "groups": _grouped(per_layer),
        "naive": _naive(r, layers, kv[0], heads, head_dim),
        "used": list({(u["name"], u["key"]): u for u in r.used}.values()),  # a key read twice is listed once
        "errors": r.errors,
        "model_type": r.family,
        **base,
    }
