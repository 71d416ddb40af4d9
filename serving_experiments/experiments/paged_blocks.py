"""Paged KV blocks: requests of different lengths on the pool as it is configured; frames replay which
request held which block at each step (from the feed's per-row block lists), beside what a contiguous
cache would reserve: each request's prompt plus its maximum answer, as a server without paging must before it
knows the answer's length, and (for scale) the whole context window per request."""

from __future__ import annotations

from serving_experiments.harness import Job, Param, ask, job, prompt_ids
from serving_experiments.prompts import NAMES, QUESTIONS, SYSTEM

PARAMS = {"requests": Param(3, 2, 6), "new_tokens": Param(8, 2, 16)}


def run(engine, params: dict) -> dict:
    facts = engine.local.loaded.facts
    kv = engine.snapshot()["kv"]
    n = params["requests"]
    payloads = {NAMES[i]: ask(QUESTIONS[i], params["new_tokens"] + 4 * i, SYSTEM) for i in range(n)}
    # a contiguous cache reserves what a request may reach: its prompt plus its maximum answer
    reach = sum(len(prompt_ids(engine, p)) + p["max_new_tokens"] for p in payloads.values())
    with job(engine) as j:
        j.submit_together(payloads)
        j.wait()
    frames, peak = block_frames(j)
    ids = sorted({b for f in frames for b in f["owners"]})  # the blocks the job touched, by physical id
    for f in frames:
        f["owners"] = [f["owners"].get(b) for b in ids]
    return {
        "frames": frames,
        "block_ids": ids,
        "block_size": kv["block_size"],
        "bytes_per_block": kv["bytes_per_block"],
        "pool_blocks": kv["total"],
        "reserved_bytes": peak["blocks"] * kv["bytes_per_block"],
        "used_bytes": peak["tokens"] * facts.kv_bytes_per_token,
        "pool_bytes": kv["total"] * kv["bytes_per_block"],
        "contiguous_bytes": reach * facts.kv_bytes_per_token,
        "contiguous_basis": f"{n} requests, each its prompt + its maximum new tokens: {reach:,} positions",
        "window_bytes": n * facts.context_window * facts.kv_bytes_per_token,
        "window_basis": f"{n} requests x {facts.context_window:,} positions (the context window)",
        "kv_bytes_per_token": facts.kv_bytes_per_token,
    }


def block_frames(j: Job) -> tuple[list[dict], dict]:
    """Frames of block ownership ({block id: request}), and the frame where our requests held the most blocks
    ({blocks, tokens} there: tokens whose keys and values sit in those blocks)."""
    held: dict[str, list[int]] = {}
    tokens: dict[str, int] = {}
    ended: set[str] = set()
    frames, peak = [], {"blocks": 0, "tokens": 0}
    for event in j.log:
        name = event.get("request")
        if event["type"] == "engine_admit":
            tokens[name] = event["cached_tokens"]
        elif event["type"] == "engine_end":
            held.pop(name, None)
            tokens.pop(name, None)
            ended.add(name)
        elif event["type"] == "engine_step":
            shared = hold_step(event, held, tokens, ended)
            frames.append({"step": len(frames) + 1, "owners": owners_of(held), "shared": sorted(shared)})
            count = len({b for bs in held.values() for b in bs})
            if count >= peak["blocks"]:
                peak = {"blocks": count, "tokens": sum(tokens.get(n, 0) for n in held)}
    return frames, peak


def hold_step(event: dict, held: dict[str, list[int]], tokens: dict[str, int], ended: set[str]) -> set[int]:
    """Apply one step's rows to what each request holds; the blocks shared in it."""
    shared: set[int] = set()
    for row in event["batch"]:
        if row["request"] in ended:  # its last step: its blocks are already back in the pool
            continue
        held[row["request"]] = row["blocks"]
        tokens[row["request"]] = tokens.get(row["request"], 0) + row["tokens"]
        shared.update(row["shared_blocks"])
    return shared


def owners_of(held: dict[str, list[int]]) -> dict[int, str]:
    owners: dict[int, str] = {}
    for owner, blocks in held.items():
        for b in blocks:
            owners.setdefault(b, owner)
    return owners
