"""The speculative-decoding experiment: each case decoded greedily on the engine's weights, plainly and
with speculation (each twice, alternating; the faster run of each is kept), outputs compared token by
token. The algorithm itself is serving_experiments.speculative."""

from __future__ import annotations

from model_runner.text.detokenizer import display_text
from serving_experiments.harness import Param, ask, prompt_ids, r3
from serving_experiments.prompts import PASSAGE
from serving_experiments.speculative import PROPOSE, PromptLookup, plain_greedy, speculative_greedy

PARAMS = {"new_tokens": Param(16, 4, 48), "k": Param(PROPOSE, 1, 8)}
RUNS = 2
CASES = (
    ("rewrite", f"Repeat this passage word for word:\n\n{PASSAGE}"),
    ("open", "Tell me a short story about a lighthouse keeper."),
)


def run(engine, params: dict, proposer=None) -> dict:
    loaded = engine.local.loaded
    proposer = proposer or PromptLookup()
    cases = []
    for kind, prompt in CASES:
        ids = prompt_ids(engine, ask(prompt, params["new_tokens"]))
        eos = loaded.tokenizer.eos_ids
        plains, specs = [], []
        for _ in range(RUNS):  # alternated, and the better of each kept: neither always runs first on a busy CPU
            plains.append(plain_greedy(loaded.model, ids, params["new_tokens"], eos))
            specs.append(speculative_greedy(loaded.model, ids, params["new_tokens"], eos, proposer, params["k"]))
        plain, spec = min(plains, key=lambda r: r.seconds), min(specs, key=lambda r: r.seconds)
        cases.append(case(loaded.tokenizer, kind, prompt, plain, spec))
    return {"method": proposer.name, "k": params["k"], "cases": cases}


def case(tok, kind: str, prompt: str, plain, spec) -> dict:
    def text(i: int) -> str:
        return display_text(tok, i)

    return {
        "kind": kind,
        "prompt": prompt,
        "steps": [
            {
                "proposed": [text(t) for t in s.proposed],
                "accepted": s.accepted,
                "rejected": s.rejected,
                "bonus": text(s.bonus) if s.bonus is not None else None,
            }
            for s in spec.steps
        ],
        "proposed": spec.proposed,
        "accepted": spec.accepted,
        "tokens": len(spec.token_ids),
        "forwards": len(spec.steps),
        "plain_forwards": len(plain.steps),
        "acceptance_rate": r3(spec.accepted / spec.proposed) if spec.proposed else None,
        "plain_ms": r3(plain.seconds * 1000),
        "spec_ms": r3(spec.seconds * 1000),
        "speedup": r3(plain.seconds / spec.seconds) if spec.seconds > 0 else None,
        "identical": plain.token_ids == spec.token_ids,
        "diverged_at": diverged_at(plain.token_ids, spec.token_ids),
        "text": "".join(text(t) for t in spec.token_ids),
    }


def diverged_at(plain: list[int], spec: list[int]) -> int | None:
    """Where the two outputs part (None when identical): low-precision kernels (the int8 route's bfloat16
    activations) can round a near-tie differently in a (k+1)-token forward than in a 1-token one."""
    if plain == spec:
        return None
    return next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
