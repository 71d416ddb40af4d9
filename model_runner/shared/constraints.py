"""Structured outputs on xgrammar: a `Constraint` (model_runner/protocol/constraint.py: a JSON object,
a JSON schema, a regex, one of some choices, or an EBNF grammar) compiled once per tokenizer, and a `Guide` per request
that, at every step, fills the request's token bitmask from its grammar matcher, applies it to that
request's logits before sampling (a forbidden token's logit becomes -inf, so it is never drawn and
nothing is re-sampled), says what the mask allowed, and advances the matcher by the chosen token.

Contract: `compiled(constraint, tokenizer, vocab_size)` raises UserError naming the constraint's
field when xgrammar refuses it or the schema uses a keyword xgrammar would not enforce; a Guide's
`apply` must be followed by `accept` of the chosen token. xgrammar is imported on first use, so a server that never constrains never loads it."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import torch

from model_runner.protocol.constraint import Constraint
from model_runner.protocol.errors import UserError

# xgrammar's errors start with its log stamp and C++ source line: "[13:40:36] /project/cpp/x.cc:83: ".
_STAMP = re.compile(r"^\[[^\]]*\]\s+\S+:\d+:\s*")
_CACHE_BYTES = 64 * 2**20  # compiled grammars kept per tokenizer


@dataclass(frozen=True)
class MaskFacts:
    """What one step's mask did: how many vocabulary tokens it allowed, and whether the token the
    model ranked first (its adjusted logits' argmax, before the mask) was among them."""

    allowed: int
    first_allowed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "first_allowed": self.first_allowed}


def choice_grammar(choices: list[str]) -> str:
    """vLLM's reading of `choice`: the answer is exactly one of the strings."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class Compiler:
    """One tokenizer's xgrammar compiler. The vocabulary is the engine's own bytes per token
    (tokenizer.token_bytes), with special tokens as empty strings so no grammar ever emits one,
    and the end tokens as the grammar's stop tokens (allowed exactly where the grammar may end)."""

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar as xgr

        special = set(getattr(tokenizer, "special_ids", ())) | set(tokenizer.eos_ids)
        vocab = [b"" if i in special else _bytes_or_empty(tokenizer, i) for i in range(vocab_size)]
        info = xgr.TokenizerInfo(
            vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=sorted(tokenizer.eos_ids)
        )
        self.vocab_size = vocab_size
        # xgrammar's own cache: a schema sent again is not compiled again.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True, cache_limit_bytes=_CACHE_BYTES)

    def compile(self, constraint: Constraint):
        try:
            if constraint.kind == "json_schema":
                _refuse_unenforced(json.loads(constraint.spec), constraint.field, "")
            return self._compile(constraint)
        except UserError:
            raise
        except (RuntimeError, ValueError) as exc:  # xgrammar's refusals, and a spec that is not JSON
            reason = _STAMP.sub("", str(exc)).strip().splitlines()[0][:300]
            raise UserError(
                f"`{constraint.field}` cannot be compiled into a grammar: {reason}", field=constraint.field
            ) from None

    def _compile(self, constraint: Constraint):
        kind, spec, c = constraint.kind, constraint.spec, self._compiler
        if kind == "json_object":  # vLLM's: any object (xgrammar's builtin JSON grammar takes any value)
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if kind == "json_schema":
            # No free whitespace, with xgrammar's default separators ", " and ": " (vLLM's server-wide
            # disable_any_whitespace would pass "," and ":"): a small model given free whitespace can
            # spend its whole budget on newlines, and the answer would never close.
            return c.compile_json_schema(spec, any_whitespace=False, strict_mode=True)
        if kind == "regex":
            return c.compile_regex(spec)
        if kind == "choice":
            return c.compile_grammar(choice_grammar(json.loads(spec)))
        return c.compile_grammar(spec)


# Sub-schemas, by how a keyword holds them: a map of names to schemas, a list of schemas, or one schema.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")


def _refuse_unenforced(schema: Any, field: str, path: str) -> None:
    """xgrammar 0.2.8 accepts these keywords but ignores them (it only logs a warning), so an answer
    could break them: refused, where vLLM's default "auto" backend would hand the schema to guidance
    (a remote engine forwards the schema, and its server decides)."""
    if not isinstance(schema, dict):
        return
    unenforced = None
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        unenforced = "allOf with more than one schema"
    elif schema.get("uniqueItems") is True:
        unenforced = "uniqueItems"
    elif "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
        unenforced = "pattern beside minLength/maxLength"
    if unenforced:
        raise UserError(
            f"`{field}` uses {unenforced} at {path or 'its root'}, which xgrammar would accept but not enforce",
            field=field,
        )
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                _refuse_unenforced(sub, field, f"{path}/{key}/{name}")
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                _refuse_unenforced(sub, field, f"{path}/{key}/{i}")
    for key in _SCHEMA_ONES:
        _refuse_unenforced(schema.get(key), field, f"{path}/{key}")


def _bytes_or_empty(tokenizer, token_id: int) -> bytes:
    try:
        return tokenizer.token_bytes(token_id)
    except (IndexError, KeyError, ValueError):  # ids past the tokenizer's own (padded logits rows)
        return b""


_compilers: dict[int, tuple[Any, Compiler]] = {}  # id(tokenizer) → (the tokenizer, its compiler)
_compilers_lock = threading.Lock()


def compiler_for(tokenizer, vocab_size: int) -> Compiler:
    with _compilers_lock:
        held = _compilers.get(id(tokenizer))
        if held is None or held[0] is not tokenizer or held[1].vocab_size != vocab_size:
            held = _compilers[id(tokenizer)] = (tokenizer, Compiler(tokenizer, vocab_size))
        return held[1]


def compiled(constraint: Constraint, tokenizer, vocab_size: int):
    """The constraint's compiled grammar for this tokenizer (cached); UserError naming its field if refused."""
    return compiler_for(tokenizer, vocab_size).compile(constraint)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask: (words,) int32, bit j of word w allowing token 32w+j → (vocab_size,) bool."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((bitmask.view(-1, 1) >> shifts) & 1).flatten()[:vocab_size].bool()


class Guide:
    """One request's grammar matcher and token bitmask, stepped once per generated token."""

    def __init__(self, grammar, vocab_size: int):
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(grammar)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # (1, ceil(vocab / 32)) int32
        self.last: MaskFacts | None = None  # the mask the latest step applied

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: (vocab,) float32 on the CPU, after penalties and bias → the same, masked in place."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        allowed = allowed_tokens(self.bitmask[0], self.vocab_size)
        first = int(torch.argmax(logits))
        self.last = MaskFacts(allowed=int(allowed.sum()), first_allowed=bool(allowed[first]))
        self._xgr.apply_token_bitmask_inplace(logits.view(1, -1), self.bitmask)
        return logits

    def accept(self, token_id: int) -> None:
        """Advance the matcher; the mask made any other token impossible, so a refusal is a bug."""
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}, which its own mask allowed")

    @property
    def complete(self) -> bool:
        return self.matcher.is_terminated()
