"""A Hugging Face config.json read into the calculator's layer groups (formulas.kv_layers), every value with the
key it came from; a key it cannot interpret is an error naming it, a key it reads outside the families it knows
is flagged, and a key that changes the cache in a way it does not model refuses the file (never a silent guess).
Where engines cache different things for one file, `engines` gives each engine's groups and the source it follows.

Key names come from one table, static/data/config-keys.json (aliases per fact, each with its families and source),
which static/js/calculator/kv-config.js reads too; tests/data/configs/ is the corpus of real files both are checked
against. Layer kinds: formulas.kv_patterns; reading one value: formulas.kv_reader. Rules and sources:
docs/calculator.md.
"""

from __future__ import annotations

from typing import Any

from formulas.kv_patterns import count_text, layer_kinds, tokens_per_image
from formulas.kv_reader import BIG, TABLE, Reader, integral, shown
from formulas.kv_state import state_keys, state_size

WEIGHT_TYPES = {"bfloat16": "fp16", "float16": "fp16", "float32": "fp32"}
STATE_TYPES = {"float32": "fp32", "bfloat16": "fp16", "float16": "fp16"}
# vLLM applies mamba_ssm_dtype to the recurrent state only, the conv state keeping the model's type
# (vllm/model_executor/layers/mamba/mamba_utils.py _mamba_state_dtype); this calculator has one state type.
STATE_DTYPE_NOTE = "state element type (here the whole state; vLLM: the recurrent state only)"
# transformers Gemma3nTextConfig.num_kv_shared_layers: the default a gemma3n_text file leaving the key out takes.
GEMMA3N_SHARED_DEFAULT = 15
MLA = TABLE["mla"]
ENGINES = TABLE["engines"]


def _kv_heads(r: Reader, layers: int, heads: int | None) -> list[int | None]:
    mq = TABLE["multi_query"]
    new_falcon = r.family in mq["falcon_types"] and r.get("new_decoder_architecture") is True
    if r.get("multi_query") is True and not new_falcon:
        r.known_for_family("multi_query", mq["families"])
        r.note("KV heads (true: one, as vLLM and transformers read it)", "multi_query", 1)
        return [1] * layers
    v = r.get("num_key_value_heads")
    if isinstance(v, list):
        if len(v) != layers or any(integral(x) is None or not 1 <= integral(x) <= BIG for x in v):
            r.error("num_key_value_heads", f"a per-layer list must hold {layers:,} whole numbers")
            return [None] * layers
        per_layer = [integral(x) for x in v]
        r.note("KV heads per layer", "num_key_value_heads", count_text(per_layer))
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


def _head_dim(r: Reader, heads: int | None) -> int | None:
    if r.family != "recurrent_gemma" and any(r.has(a["key"]) for a in TABLE["facts"]["head_dim"]["aliases"]):
        return r.fact("head_dim", 1, 65536)
    hidden = r.fact("hidden_size")
    if hidden is None or not heads:
        return None
    if hidden % heads:
        r.error("hidden_size", f"{hidden} does not split over {heads} heads, and head_dim is not given")
        return None
    why = (
        "RecurrentGemmaConfig sets head_dim = hidden_size // num_attention_heads"
        if r.family == "recurrent_gemma"
        else ""
    )
    r.note("head dim", "hidden_size / num_attention_heads", hidden // heads, why)
    return hidden // heads


def _mla(r: Reader) -> dict | None:
    latent = r.whole("kv_lora_rank", "MLA latent rank", 1, 65536)
    rope = r.whole("qk_rope_head_dim", "MLA RoPE dims", 0, 65536)
    return None if latent is None or rope is None else {"latent": latent, "rope_dim": rope}


def _full_heads(r: Reader, heads: int | None) -> dict | None:
    """vLLM's MiniCPM3 (models/minicpm3.py): plain Attention over every head, K and V both qk_nope + qk_rope wide
    (V padded to it), so the cache holds full per-head keys and values, not the latent."""
    nope = r.whole("qk_nope_head_dim", "MLA no-RoPE key dims", 0, 65536, 64, "transformers MiniCPM3Config default")
    rope = r.whole("qk_rope_head_dim", "MLA RoPE dims", 0, 65536)
    kv = heads  # vLLM: num_kv_heads=self.num_local_heads, the attention heads, whatever num_key_value_heads says
    if kv is None:
        r.error("num_attention_heads", "missing: vLLM's MiniCPM3 caches one key and value per attention head")
    else:
        r.note("KV heads (vLLM's MiniCPM3: one per attention head)", "num_attention_heads", kv)
    if None in (nope, rope, kv) or nope + rope == 0:
        return None
    return {"kind": "full", "kv_heads": kv, "head_dim": nope + rope}


def _extras(r: Reader, kinds: list[str], context: int | None, heads: int | None) -> dict:
    extra: dict = {}
    if r.has("kv_lora_rank"):
        extra["mla"] = _mla(r) if r.family not in MLA["full_heads"] else _full_heads(r, heads)
    if "sliding" in kinds:
        key, default, why = "sliding_window", None, ""
        if r.family == "recurrent_gemma":  # RecurrentGemmaConfig.attribute_map: sliding_window → attention_window_size
            key, default, why = "attention_window_size", 2048, "transformers RecurrentGemmaConfig default"
        extra["window"] = r.whole(key, "sliding window", 1, BIG, default, why)
        if extra["window"] and context and extra["window"] >= context:
            r.flag(key, f"window {extra['window']:,} ≥ the context {context:,}: it never binds there")
    if "chunked" in kinds:
        extra["chunk"] = r.whole("attention_chunk_size", "attention chunk")
    if "linear" in kinds:
        extra["state"] = state_size(r)
    if "cross" in kinds:
        extra["per_image"] = tokens_per_image(r)
    return extra


def _layer(kind: str, kv: int | None, head_dim: int | None, extra: dict) -> dict:
    if kind == "linear":
        return {"kind": "state", **(extra.get("state") or {"conv": 0, "state": 0})}
    if kind == "cross":
        return {"kind": "cross", "kv_heads": kv, "head_dim": head_dim, "per_image": extra.get("per_image") or 1}
    if extra.get("mla"):
        return {"kind": "mla", **extra["mla"]} if "latent" in extra["mla"] else dict(extra["mla"])
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


def _all_full_attention(r: Reader) -> bool:
    """A minimax_m2 attn_type_list of one 1 per layer: vLLM's models/minimax_m2.py never reads the list and gives
    every layer full attention, which the list then says too."""
    types, layers = r.get("attn_type_list"), integral(r.get("num_hidden_layers"))
    if r.family != "minimax_m2" or not isinstance(types, list) or len(types) != layers:
        return False
    if any(integral(t) != 1 for t in types):
        return False
    r.note("attention types (1: full attention in every layer)", "attn_type_list", f"{layers} full")
    return True


def _refuse_unread(r: Reader) -> None:
    """Keys that change the cache in a way this calculator does not model: the file is refused, key named."""
    for entry in TABLE["unread"]:
        v = r.get(entry["key"])
        if v is None or v is False or v == 0:
            continue
        if entry["key"] == "attn_type_list" and _all_full_attention(r):
            continue
        r.error(entry["key"], f"{entry['why']}, so this calculator refuses the file rather than count it wrong")


def _layer_count(r: Reader) -> int | None:
    """Cache layers. LongCat-Flash holds two MLA attentions per decoder layer, each with its own cache (vLLM
    models/longcat_flash.py; transformers LongcatFlashConfig.num_hidden_layers = 2 × num_layers): 2 × num_layers;
    a num_hidden_layers in such a file already counts both."""
    if r.family not in MLA["two_per_layer"] or not r.has("num_layers"):
        return r.fact("layers", 1, 4096)
    decoder = r.whole("num_layers", "decoder layers, two MLA attentions each", 1, 2048)
    flat = r.get("num_hidden_layers")
    if decoder is None or (flat is not None and integral(flat) != 2 * decoder):
        if decoder is not None:
            r.error(
                "num_hidden_layers",
                f"{shown(flat)} is not 2 × num_layers ({2 * decoder:,}), as LongcatFlashConfig has it",
            )
        return None
    r.note("attention layers (2 × num_layers)", "num_layers", 2 * decoder)
    return 2 * decoder


def _refuse_mla_family(r: Reader) -> None:
    """An MLA file whose family no engine rule here covers: whether the latent or full heads are cached is the
    model file's choice (vLLM's MiniCPM3 caches full heads), so it is not guessed."""
    if r.has("kv_lora_rank") and r.family and r.family not in (*MLA["latent"], *MLA["full_heads"]):
        r.error(
            "kv_lora_rank",
            f"model_type {r.family}: whether its engines cache the MLA latent or full per-head keys and values is "
            "not known here (the latent is counted only for the MLA families whose model file was read), so the file is refused",
        )


def _flag_outside_families(r: Reader) -> None:
    if not r.family:
        r.flag("model_type", "not given: keys are read by their names alone")
    for key, spec in TABLE["known"].items():
        if key != "layer_types" and r.has(key):
            r.known_for_family(key, spec["families"])


def _weights(r: Reader) -> dict | None:
    """The weights' element type as the file states it: an fp8 quantization block, else torch_dtype / dtype."""
    for where in (r.top, r.cfg):
        q = where.get("quantization_config")
        if isinstance(q, dict) and q.get("quant_method") is not None:
            method = q["quant_method"]
            if not isinstance(method, str):
                return None  # refused by _type_fields
            if method in TABLE["weights"]["quant_method"]:
                block = q.get("weight_block_size")
                fmt = q.get("fmt") if isinstance(q.get("fmt"), str) else ""
                note = f"fp8 {fmt} weights".replace("  ", " ")
                if isinstance(block, list) and all(integral(b) is not None for b in block):
                    note += f", one scale per {' × '.join(str(integral(b)) for b in block)} block (not counted)"
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


def _naive(r: Reader, layers: int, kv: int | None, heads: int | None, head_dim: int | None) -> dict | None:
    """The one formula's numbers; for MLA the cache it compresses: every head's key (nope + RoPE) and value."""
    if not r.has("kv_lora_rank"):
        return {"layers": layers, "kv_heads": kv, "head_dim": head_dim}
    nope, rope, value = (r.get(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    if None in (integral(nope), integral(rope), integral(value)) or not heads:
        return None
    return {
        "layers": layers,
        "kv_heads": heads,
        "key_dim": integral(nope) + integral(rope),
        "value_dim": integral(value),
    }


def _shared_layers(r: Reader, layers: int) -> int | None:
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


def _key_value_heads(r: Reader, layers: int, heads: int | None) -> list[dict] | None:
    """llama.cpp's MiniCPM3: keys of qk_nope + qk_rope per head, values of hidden_size / heads per head (its GGUF
    has no value length, so llama.cpp takes n_embd / n_head)."""
    full = _full_heads(r, heads)
    hidden = integral(r.get("hidden_size"))  # read quietly: the page's own reading is done and listed
    if full is None or hidden is None or not heads or hidden % heads:
        return None
    return [{**full, "layers": layers, "value_dim": hidden // heads}]


def _engines(r: Reader, kinds: list[str], groups: list[dict], extra: dict, heads: int | None) -> list[dict]:
    """What each engine caches for this file, where that is said per family (config-keys.json `engines`)."""
    if r.family in ENGINES:
        rule = ENGINES[r.family]
    elif r.has("kv_lora_rank") and r.family in MLA["latent"]:
        rule = ENGINES["mla-latent"]
    elif "linear" in kinds:
        rule = ENGINES["state"]
    else:
        return []
    out = []
    for e in rule:
        engine = {"engine": e["engine"], "source": e["source"], "groups": groups if e.get("groups") != "none" else None}
        if e.get("groups") == "latent":  # this engine caches the latent though the page follows another one
            latent = _mla(r)
            engine["groups"] = None if latent is None else [{"kind": "mla", "layers": len(kinds), **latent}]
        if e.get("groups") == "key-value-heads":
            engine["groups"] = _key_value_heads(r, len(kinds), heads)
        if "storage" in e:
            engine["storage"] = e["storage"]
        out.append(engine)
    return out


def _family(config: dict) -> tuple[str, dict | None]:
    """model_type as a string, or the error for a type field that is not one (a list, an object, a number)."""
    for where, prefix in ((config.get("text_config"), "text_config."), (config, "")):
        if isinstance(where, dict) and where.get("model_type") is not None:
            v = where["model_type"]
            if not isinstance(v, str):
                return "", {"field": prefix + "model_type", "message": f"must be a string (got {shown(v)})"}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return str(text.get("model_type") or config.get("model_type") or ""), None


def _type_fields(r: Reader) -> None:
    """Fields that must be strings when present: a list or a number there is refused, not read as something."""
    places = ((r.top, ""), (r.cfg, r.prefix)) if r.cfg is not r.top else ((r.top, ""),)
    for where, prefix in places:
        q = where.get("quantization_config")
        if isinstance(q, dict) and q.get("quant_method") is not None and not isinstance(q["quant_method"], str):
            message = f"must be a string (got {shown(q['quant_method'])})"
            r.errors.append({"field": prefix + "quantization_config.quant_method", "message": message})
    v = r.get("mamba_ssm_dtype")
    if v is not None and not isinstance(v, str):
        r.error("mamba_ssm_dtype", f"must be a string (got {shown(v)})")


def _refused(message: str, field: str = "config") -> dict:
    return {
        "groups": [],
        "naive": None,
        "used": [],
        "errors": [{"field": field, "message": message}],
        "flags": [],
        "context_window": None,
        "weights": None,
        "state_dtype": None,
        "model_type": "",
        "engines": [],
    }


def read_config(config: Any) -> dict:
    """{groups, naive, used, errors, flags, context_window, weights, state_dtype, model_type, engines}: `errors`
    empty means `groups` is the whole model; `flags` are keys read outside the families this table knows them in."""
    if not isinstance(config, dict):
        return _refused("not a JSON object")
    if config.get("text_config") is not None and not isinstance(config["text_config"], dict):
        return _refused("text_config must be an object")
    family, bad_type = _family(config)
    if bad_type:
        return _refused(bad_type["message"], bad_type["field"])
    refused_family = TABLE["refused_families"]["families"].get(family)
    if refused_family:
        return _refused(f"{family}: {refused_family}, so this calculator refuses the file", "model_type")
    r = Reader(config, family)
    _refuse_unread(r)
    _refuse_mla_family(r)
    _type_fields(r)
    _flag_outside_families(r)
    layers = _layer_count(r)
    heads = r.fact("attention_heads", 1, BIG, None, "not given: only the KV heads matter")
    context = r.fact("context", 1, BIG, None, "no context limit")
    weights = _weights(r)
    mamba_dtype = r.get("mamba_ssm_dtype")
    state_dtype = STATE_TYPES.get(mamba_dtype) if isinstance(mamba_dtype, str) else None
    if state_dtype:
        r.note(STATE_DTYPE_NOTE, "mamba_ssm_dtype", mamba_dtype)
    base = {"flags": r.flags, "context_window": context, "weights": weights, "state_dtype": state_dtype}
    if layers is None:
        return {
            "groups": [],
            "naive": None,
            "used": r.used,
            "errors": r.errors,
            "model_type": r.family,
            "engines": [],
            **base,
        }
    kinds = layer_kinds(r, layers) or ["full"] * layers
    if "linear" not in kinds and state_keys(r) and not r.errors:  # a refused pattern already names its key
        r.error(state_keys(r)[0], "sizes a recurrent state, but no layer of this file is a state layer")
    needs_heads = any(k != "linear" for k in kinds) and not r.has("kv_lora_rank")
    kv = _kv_heads(r, layers, heads) if needs_heads else [None] * layers
    head_dim = _head_dim(r, heads) if needs_heads else None
    extra = _extras(r, kinds, context, heads)
    per_layer = [_layer(k, kv[i], head_dim, extra) for i, k in enumerate(kinds)]
    shared = _shared_layers(r, layers)
    for i in range(layers - (shared or 0), layers):
        per_layer[i] = {"kind": "shared"}
    groups = _grouped(per_layer)
    return {
        "groups": groups,
        "naive": _naive(r, layers, kv[0], heads, head_dim),
        "used": list({(u["name"], u["key"]): u for u in r.used}.values()),  # a key read twice is listed once
        "errors": r.errors,
        "model_type": r.family,
        "engines": [] if r.errors else _engines(r, kinds, groups, extra, heads),
        **base,
    }
