"""Why the same prompt can answer differently: greedy requests sent alone, then all together in one batch,
first on the engine's default route and then in batch-invariant mode (model_runner/local/step/invariant.py); for
each request whether its batched answer is its lone one, where the first one parts, the two candidates there
with their probabilities and logit gap alone and batched, and what each mode's steps cost."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

from model_runner.protocol.errors import UserError
from model_runner.protocol.metrics import percentile
from serving_experiments.harness import Param, ask, job, r3
from serving_experiments.prompts import NAMES, QUESTIONS

PARAMS = {"requests": Param(8, 2, 8), "new_tokens": Param(32, 4, 64)}
MODES = ("default", "invariant")


@contextmanager
def mode(engine, invariant: bool):
    """The engine in (or out of) batch-invariant mode for the block (the policy's `batch_invariant`; prefix
    caching off while it is on), and back as it was after, unless someone (the teacher's switch) set the mode
    meanwhile: then their choice stands."""
    before = engine.policy
    engine.set_policy(batch_invariant=invariant, prefix_caching=before.prefix_caching and not invariant)
    try:
        yield
    finally:
        if engine.policy.batch_invariant == invariant:
            engine.set_policy(batch_invariant=before.batch_invariant, prefix_caching=before.prefix_caching)


def run(engine, params: dict) -> dict:
    work = {NAMES[i]: QUESTIONS[i] for i in range(params["requests"])}
    runs = {}
    for name in MODES:
        with mode(engine, name == "invariant"):
            runs[name] = run_mode(engine, work, params["new_tokens"])
            runs[name]["report"] = engine.local.batch_invariance()  # what the mode rested on here, when on
    return {"requests": params["requests"], "new_tokens": params["new_tokens"], "runs": runs, "cost": cost(runs)}


def run_mode(engine, work: dict[str, str], new_tokens: int) -> dict:
    """Each request alone (a job each: a job's deadline is per job), then all of them in one batch."""
    streams: dict[str, list[dict]] = {}
    steps: list[dict] = []
    # Prefix caching off in both modes: the mode keeps it off, and the default's run must differ by the mode only.
    policy = {"prefix_caching": False, "chunked_prefill": False}
    t0 = time.monotonic()
    for request, question in work.items():
        with job(engine, **policy) as j:
            j.submit(f"{request}-alone", ask(question, new_tokens))
            streams.update(wait_tokens(j))
            steps += j.steps
    lone_s = time.monotonic() - t0
    t0 = time.monotonic()
    with job(engine, **policy) as j:
        j.submit_together({request: ask(question, new_tokens) for request, question in work.items()})
        streams.update(wait_tokens(j))
        steps += j.steps
    batched_s = time.monotonic() - t0
    return compare(work, streams, steps, lone_s, batched_s)


def wait_tokens(j) -> dict[str, list[dict]]:
    """Until the job's requests have ended → each newly ended request's token events (id, text, prob,
    candidates), its stream drained here; an experiment request that did not finish fails the run."""
    j.pump(lambda: all(h.done for h in j.handles.values()))
    out = {}
    for name, handle in j.handles.items():
        if name in j.terminals:
            continue
        events = [e.to_dict() for e in handle]
        end = j.terminals[name] = events[-1]
        if end["type"] != "finished" or end["reason"] == "timeout":
            why = end.get("message") or end.get("cause") or end.get("reason") or ""
            raise UserError(f"an experiment request ended with {end['type']}: {why}", code="internal")
        out[name] = [e for e in events if e["type"] == "token"]
    j.wait()  # the feed's steps of these requests, read in full
    return out


def compare(work: dict, streams: dict, steps: list[dict], lone_s: float, batched_s: float) -> dict:
    """Each request's batched answer against its lone one, and the mode's step times and throughput."""
    requests, parting = [], None
    for request in work:
        alone, together = streams[f"{request}-alone"], streams[request]
        index = first_parting(alone, together)
        same_probs = sum(a["prob"] == b["prob"] for a, b in zip(alone, together))
        requests.append(
            {
                "request": request,
                "question": work[request],
                "same_answer": index is None,
                "parts_at": index,
                "tokens": len(alone),
                "same_prob_tokens": same_probs,  # steps whose chosen token's probability is the same float
                "compared_tokens": min(len(alone), len(together)),
            }
        )
        if index is not None and parting is None:
            at = (alone[index] if index < len(alone) else None, together[index] if index < len(together) else None)
            parting = near_tie(request, work[request], index, *at)
    lone_ms = [s["ms"] for s in steps if s["batch"] and s["batch"][0]["request"].endswith("-alone")]
    batched_ms = [s["ms"] for s in steps if s["batch"] and not s["batch"][0]["request"].endswith("-alone")]
    tokens = sum(r["tokens"] for r in requests)
    return {
        "requests": requests,
        "same_answers": sum(r["same_answer"] for r in requests),
        "first_parting": parting,
        "step_ms_median": {"alone": r3(percentile(lone_ms, 50)), "batched": r3(percentile(batched_ms, 50))},
        "tokens_per_s": {"alone": r3(tokens / lone_s), "batched": r3(tokens / batched_s)},
    }


def first_parting(alone: list[dict], together: list[dict]) -> int | None:
    """The index of the first token where the two answers differ; None when they are the same."""
    for index, (a, b) in enumerate(zip(alone, together)):
        if a["id"] != b["id"]:
            return index
    return None if len(alone) == len(together) else min(len(alone), len(together))


def near_tie(request: str, question: str, index: int, alone: dict | None, together: dict | None) -> dict | None:
    """The two tokens at the parting place (the lone answer's and the batched one's), with the probability
    each run gave each of them and their logit gap ln(p1/p2) (the softmax's ratio is e to the logit gap)."""
    if alone is None or together is None:
        return None
    pair = [alone["id"], together["id"]]
    texts = {alone["id"]: alone["text"], together["id"]: together["text"]}
    for c in alone["candidates"] + together["candidates"]:
        texts.setdefault(c["id"], c["text"])
    side = {}
    for run_name, event in (("alone", alone), ("batched", together)):
        probs = {c["id"]: c["prob"] for c in event["candidates"]}
        p = [probs.get(token) for token in pair]
        gap = math.log(p[0] / p[1]) if None not in p and p[1] > 0 else None
        side[run_name] = {"probs": p, "logit_gap": gap}
    return {
        "request": request,
        "question": question,
        "index": index,
        "tokens": [{"id": token, "text": texts.get(token, "")} for token in pair],
        **side,
    }


def cost(runs: dict) -> dict:
    """What the mode costs here: its median step times and throughput against the default's, as ratios."""
    out = {}
    for key in ("step_ms_median", "tokens_per_s"):
        for where in ("alone", "batched"):
            a, b = runs["default"][key][where], runs["invariant"][key][where]
            out[f"{key}.{where}"] = r3(b / a) if a and b else None
    return out
