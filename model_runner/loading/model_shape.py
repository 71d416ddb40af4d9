"""The cost model's Shape of a loaded model, counted from its modules as they run (after any
quantization): the multiplied, quantized and other weights, and whether the head is tied."""

from __future__ import annotations

import torch

from formulas.cost import Shape
from model_runner.loading.packed import PackedLinear
from model_runner.loading.quantize import Int4Linear, Int8Linear, RescoredHead


def shape_of(loaded) -> Shape:
    """The Shape of a LoadedModel, counted from its modules as they run (after any quantization)."""
    return shape_from_model(loaded.model, loaded.facts)


def shape_from_model(model, facts) -> Shape:
    """Count the multiplied, quantized and other weights of `model` as its layers run; the head is the layer
    that makes the vocabulary's logits, tied when its float weights are the embedding's own tensor."""
    embedding = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
    heads = [m for m in model.modules() if isinstance(m, RescoredHead)]
    inside_head = {id(m) for h in heads for m in h.modules()}
    counts = {"matmul": 0, "quantized": 0, "rows": 0, "other": 0, "float_prefill": False}
    for module in model.modules():
        if id(module) in inside_head:
            continue
        if isinstance(module, (torch.nn.Linear, PackedLinear, Int4Linear, Int8Linear)):
            if _makes_logits(module, facts):
                heads.append(module)
                continue
            _count_linear(module, counts, quantized=isinstance(module, (Int4Linear, Int8Linear)))
        elif module is not embedding:
            counts["other"] += sum(p.numel() for p in module.parameters(recurse=False))
    if not heads:
        raise ValueError(f"no layer of the model makes {facts.vocab_size} logits from {facts.hidden_size} inputs")
    head = heads[0]
    head_weight = head.float_weight if isinstance(head, RescoredHead) else head.weight
    counts["other"] += head.bias.numel() if head.bias is not None else 0
    return Shape(
        route=facts.weights_dtype or facts.dtype,
        layers=facts.layers,
        attention_heads=facts.attention_heads,
        kv_heads=facts.kv_heads,
        head_dim=facts.head_dim,
        hidden_size=facts.hidden_size,
        vocab_size=facts.vocab_size,
        bytes_per_element=facts.bytes_per_element,
        matmul_params=counts["matmul"],
        quantized_params=counts["quantized"],
        quantized_rows=counts["rows"],
        other_params=counts["other"],
        tied_embeddings=_same_memory(head_weight, embedding.weight),
        float_prefill=counts["float_prefill"],
    )


def _same_memory(a, b) -> bool:
    """One tensor in memory (a detached view of the embedding is still the embedding's bytes)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape


def _makes_logits(module, facts) -> bool:
    return module.out_features == facts.vocab_size and module.in_features == facts.hidden_size


def _count_linear(module, counts: dict, quantized: bool) -> None:
    weights = module.in_features * module.out_features
    counts["matmul"] += weights
    counts["other"] += module.bias.numel() if module.bias is not None else 0
    if quantized:
        counts["quantized"] += weights
        counts["rows"] += module.out_features
        counts["float_prefill"] |= getattr(module, "float_weight", None) is not None  # Int4Linear(keep_float=True)
