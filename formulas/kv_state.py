"""The per-sequence state of a state layer (Mamba, Jamba, gated linear attention, RecurrentGemma's recurrent
block): conv and recurrent elements per layer as transformers' caches shape them, each size refused under the
file's key when it passes what kv_layers holds. static/js/calculator/kv-state.js is the twin."""

from __future__ import annotations

from formulas.kv_reader import BIG, TABLE, Reader

MAX_STATE = 2**40  # elements of one layer's state: past it a value is a typo or a test (kv_layers' own limit)


def _bounded(r: Reader, key: str, parts: list[int], what: str) -> int | None:
    """A state size from its factors, refused under `key` (the file's key) when it passes MAX_STATE."""
    total = 1
    for p in parts:
        total *= p
    if total > MAX_STATE:
        said = " × ".join(f"{p:,}" for p in parts)
        r.error(key, f"{said} = {total:,} {what} elements a layer, past the 2^40 this calculator holds")
        return None
    return total


def _key_of(r: Reader, fact: str) -> str:
    return next(
        (a["key"] for a in TABLE["facts"][fact]["aliases"] if r.has(a["key"])), TABLE["facts"][fact]["standard"]
    )


def _mamba_state(r: Reader) -> dict | None:
    expand, conv, size = r.fact("mamba_expand"), r.fact("mamba_conv"), r.fact("mamba_state")
    hidden = r.fact("hidden_size")
    if None in (expand, conv, size, hidden):
        return None
    conv_total = _bounded(r, _key_of(r, "mamba_conv"), [expand, hidden, conv], "conv")
    state_total = _bounded(r, _key_of(r, "mamba_state"), [expand, hidden, size], "recurrent")
    if None in (conv_total, state_total):
        return None
    return {"conv": conv_total, "state": state_total, "conv_kernel": conv}


def _linear_state(r: Reader) -> dict | None:
    nk, dk = (
        r.whole("linear_num_key_heads", "linear key heads", 1, 65536),
        r.whole("linear_key_head_dim", "linear key dim", 1, 65536),
    )
    nv = r.whole("linear_num_value_heads", "linear value heads", 1, 65536)
    dv = r.whole("linear_value_head_dim", "linear value dim", 1, 65536)
    kernel = r.whole("linear_conv_kernel_dim", "linear conv width", 1, 1024)
    if None in (nk, dk, nv, dv, kernel):
        return None
    conv = _bounded(r, "linear_conv_kernel_dim", [2 * nk * dk + nv * dv, kernel], "conv")
    state = _bounded(r, "linear_value_head_dim", [nv, dk, dv], "recurrent")
    return None if None in (conv, state) else {"conv": conv, "state": state, "conv_kernel": kernel}


def _griffin_state(r: Reader) -> dict | None:
    """RecurrentGemma's recurrent block per sequence (transformers RecurrentGemmaRecurrentBlock): the conv1d_state
    carried from prefill through decode is x_branch, lru_width × (conv1d_width − 1) in the model's type (_setup_cache
    allocates hidden_size channels, equal in every published file), and the RG-LRU state lru_width in float32."""
    hidden = r.fact("hidden_size")
    width = r.whole("conv1d_width", "conv1d width", 1, 1024, 4, "transformers RecurrentGemmaConfig default")
    lru = r.whole("lru_width", "RG-LRU width", 1, BIG, hidden, "transformers RecurrentGemmaConfig: hidden_size")
    if None in (hidden, width, lru):
        return None
    if lru != hidden:
        r.flag(
            "lru_width",
            f"{lru:,} ≠ hidden_size {hidden:,}: the conv state is counted lru_width wide, as decode fills it",
        )
    conv = _bounded(r, "conv1d_width", [lru, width - 1], "conv")
    return None if conv is None else {"conv": conv, "state": lru, "recurrent_bytes": 4}


STATE_KEYS = ("linear_num_value_heads", "linear_conv_kernel_dim", "lru_width", "conv1d_width")


def state_keys(r: Reader) -> list[str]:
    facts = ("mamba_state", "mamba_conv", "mamba_expand")
    return [a["key"] for f in facts for a in TABLE["facts"][f]["aliases"] if r.has(a["key"])] + [
        k for k in STATE_KEYS if r.has(k)
    ]


def state_size(r: Reader) -> dict | None:
    """Conv and recurrent elements per state layer per sequence, as transformers' caches shape them (a Mamba conv
    state keeps conv_kernel columns there; vLLM keeps conv_kernel − 1, kv_layers applies the choice)."""
    if r.family == "recurrent_gemma":
        return _griffin_state(r)
    if any(r.has(a["key"]) for a in TABLE["facts"]["mamba_state"]["aliases"]):
        return _mamba_state(r)
    if r.has("linear_num_value_heads"):
        return _linear_state(r)
    r.error("layer_types", "linear-attention layers, but no mamba_* / state_size or linear_* keys to size their state")
    return None
