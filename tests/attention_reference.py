"""The reference the streamed attention is checked against: a plain forward over a request's whole
token history with transformers' eager attention, no KV cache and `output_attentions=True`, and the
check that an `attention` event agrees with it (tests/unit on the fake model, tests/model on the real one)."""

from __future__ import annotations

import math

import torch

from model_runner.local.model.attention_inspect import BINS, TOP_K, bin_width


def eager_weights(model, ids: list[int]) -> torch.Tensor:
    """The last position's attention weights [layers, heads, len(ids)] from an eager, cache-free forward.
    Switches the model's attention: only on a model no engine is running."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    return torch.stack([layer[0, :, -1, :].float().cpu() for layer in out.attentions])


def spans(weights: torch.Tensor) -> list[float]:
    """weights [n] → the weight on each histogram span of `bin_width(n)` positions."""
    width = bin_width(len(weights))
    return [float(weights[i : i + width].sum()) for i in range(0, len(weights), width)]


def check_against(event: dict, reference: torch.Tensor, tol: float) -> None:
    """Assert an `attention` event matches reference weights [layers, heads, n] within `tol`."""
    layers, _, n = reference.shape
    assert event["positions"] == n and event["query_position"] == n - 1 and len(event["layers"]) == layers
    assert event["bin_width"] == bin_width(n) and len(event["all"]["bins"]) == math.ceil(n / bin_width(n)) <= BINS
    mean = reference.mean(1)
    _check_distribution(event["all"], mean.mean(0), tol, with_bins=True)
    for layer, sent in enumerate(event["layers"]):
        assert abs(sum(sent["mean"]["bins"]) - 1.0) < 1e-3, f"layer {layer}: its weights do not sum to 1"
        _check_distribution(sent["mean"], mean[layer], tol, with_bins=True)
        entropy = -(reference[layer] * reference[layer].clamp_min(1e-30).log()).sum(-1)
        head = sent["sharpest"]["head"]
        assert entropy[head] <= entropy.min() + tol, f"layer {layer}: head {head} is not the sharpest"
        assert abs(sent["sharpest"]["entropy"] - float(entropy[head])) < 1e-3 + tol
        _check_distribution(sent["sharpest"], reference[layer, head], tol, with_bins=False)


def _check_distribution(sent: dict, weights: torch.Tensor, tol: float, with_bins: bool) -> None:
    top = sent["top"]
    assert len(top) == min(TOP_K, len(weights))
    for position, weight in top:
        assert abs(weight - float(weights[position])) < tol, (position, weight, float(weights[position]))
    kth = torch.topk(weights, len(top)).values[-1]
    assert all(float(weights[p]) >= kth - tol for p, _ in top), "a position outside the reference top-k was sent"
    assert [w for _, w in top] == sorted((w for _, w in top), reverse=True)
    if with_bins:
        assert all(abs(a - b) < tol for a, b in zip(sent["bins"], spans(weights), strict=True))
