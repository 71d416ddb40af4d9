"""The scheduling policy both engines report and the local one runs by: batching mode, batch and
token caps, chunked prefill, prefix caching, batch-invariant mode; changed only through `updated`, which
checks each field and the one rule between two of them (batch-invariant mode keeps prefix caching off)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import check_bool, check_choice, check_int

BATCHING_MODES = ("continuous", "static")
POLICY_LIMITS = {"max_num_seqs": (1, 256), "max_batch_tokens": (16, 8192), "chunk_size": (1, 8192)}


@dataclass(frozen=True)
class Policy:
    batching: str = "continuous"  # "static": admit only when the running batch has emptied
    max_num_seqs: int = 16  # requests in the running batch at once
    max_batch_tokens: int = 512  # tokens per step (decode tokens first, then prefill)
    chunked_prefill: bool = False  # split prompts into chunks that share steps with decodes
    chunk_size: int = 64  # prompt tokens per chunk when chunked_prefill is on
    prefix_caching: bool = False  # share the KV blocks of identical full-block prompt prefixes
    # A request's logits the same bits whatever its company (local/step/invariant.py): decode rows padded to
    # max_num_seqs as the mode is first switched on, each prompt alone, no graphs; slower.
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        """The one rule between two fields, however a policy is made."""
        if self.batch_invariant and self.prefix_caching:
            raise UserError(
                "batch-invariant mode keeps prefix caching off (a shared prefix was computed inside another "
                "request's prompt, at other shapes, so it holds other bits): turn prefix caching off before "
                "the mode, or the mode off before prefix caching",
                field="prefix_caching",
            )

    def updated(self, changes: dict[str, Any]) -> "Policy":
        """A copy with `changes`; UserError naming the field and its limit when one is bad."""
        known = {f.name: f.type for f in fields(self)}
        for name, value in changes.items():
            if name not in known:
                raise UserError(f"`{name}` is not a scheduling policy; known: {', '.join(known)}", field=name)
            if name == "batching":
                check_choice(name, value, BATCHING_MODES)
            elif name in ("chunked_prefill", "prefix_caching", "batch_invariant"):
                check_bool(name, value)
            else:
                check_int(name, value, *POLICY_LIMITS[name])
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
