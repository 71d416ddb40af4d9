"""The experiments contract's shapes (docs/protocol.md, "Experiments API"), checked in one place: a 200
answer of POST /api/experiments/<name>, and the recorded static/data/serving-trace.json made of them."""

from __future__ import annotations

from typing import Any

from serving_experiments.experiments.why_batch import BATCHES
from serving_experiments.registry import EXPERIMENTS

# How a source line names the decoder that ran a run's steps, by the engine's decoder report's `name`
# (model_runner/local/model/decoders.py): the same model runs at another speed on the other one.
DECODER_WORDS = {"native": "the native step", "transformers": "transformers' forward"}


def decoder_words(report: dict | None) -> str:
    """The decoder that ran a run's steps, as its source line names it (the engine's decoder report)."""
    name = (report or {}).get("name")
    return DECODER_WORDS.get(name, f"decoder {name}" if name else "decoder not reported by the engine")


RESULT_KEYS = {
    "why_batch": {"points"},
    "batching": {"workload", "runs"},
    "paged_blocks": {
        "frames",
        "block_size",
        "bytes_per_block",
        "pool_blocks",
        "reserved_bytes",
        "used_bytes",
        "pool_bytes",
        "contiguous_bytes",
    },
    "chunked_prefill": {"chunk_size", "long_prompt_tokens", "runs"},
    "prefix_caching": {"system_prompt_tokens", "runs"},
    "attention_cost": {"points", "fit", "floor", "limit", "kv_bytes_per_token"},
    "speculative": {"method", "cases"},
    "pricing": {"prefill_ms_per_token", "decode_ms_per_token", "ratio", "prompt_tokens", "new_tokens"},
    "batch_invariance": {"requests", "new_tokens", "runs", "cost"},
}
# Experiments recorded in a file of their own, not in static/data/serving-trace.json.
RECORDED_APART = {"batch_invariance": "static/data/invariance-trace.json"}
CELLS = {"prefill", "decode", "waiting", "idle", "done", "preempted"}


def _missing(where: str, data: Any, keys: set[str]) -> list[str]:
    if not isinstance(data, dict):
        return [f"{where}: not an object"]
    return [f"{where}: no `{k}`" for k in sorted(keys - set(data))]


def check_response(name: str, body: Any) -> list[str]:
    """What is wrong with a 200 answer of POST /api/experiments/<name> (or a trace's copy); [] = fits."""
    problems = _missing(name, body, {"name", "provenance", "machine", "params", "result"})
    if problems:
        return problems
    if body["name"] != name or body["provenance"] != "measured":
        problems.append(f"{name}: name {body['name']!r} / provenance {body['provenance']!r}")
    problems += _missing(f"{name}.machine", body["machine"], {"threads", "load_1m"})
    result = body["result"]
    problems += _missing(f"{name}.result", result, RESULT_KEYS.get(name, set()))
    if problems:
        return problems
    return problems + RESULT_CHECKS[name](result)


def _check_why_batch(result: dict) -> list[str]:
    out = [p for point in result["points"] for p in _missing("why_batch.points[]", point, {"batch", "step_ms"})]
    if [p["batch"] for p in result["points"]] != list(BATCHES):
        out.append(f"why_batch: batches {[p.get('batch') for p in result['points']]} != {list(BATCHES)}")
    if "roofline" in result:
        roof = result["roofline"]
        out += _missing("why_batch.roofline", roof, {"peak_flops_s", "bandwidth_bytes_s", "points"})
        for point in roof.get("points", []):  # each judged against the kernels that ran it
            out += _missing("why_batch.roofline.points[]", point, {"kernel", "kernel_ms", "memory_ms", "held_by"})
    return out


def _check_run_steps(where: str, run: dict, requests: set[str]) -> list[str]:
    out = _missing(where, run, {"steps", "throughput_tps", "p95_latency_ms", "idle_slot_share"})
    for step in run.get("steps", []):
        if set(step["cells"]) != requests or not set(step["cells"].values()) <= CELLS:
            out.append(f"{where}: step {step.get('step')} cells {step['cells']}")
            break
    return out


def _check_batching(result: dict) -> list[str]:
    requests = {w["request"] for w in result["workload"]}
    out = _missing("batching.runs", result["runs"], {"static", "continuous"})
    for mode in ("static", "continuous"):
        out += _check_run_steps(f"batching.runs.{mode}", result["runs"].get(mode, {}), requests)
    return out


def _check_paged(result: dict) -> list[str]:
    out = []
    for frame in result["frames"]:
        if len(frame["owners"]) != len(result.get("block_ids", frame["owners"])) or not isinstance(
            frame["shared"], list
        ):
            out.append(f"paged_blocks: frame {frame.get('step')} owners/shared")
            break
    if not result["frames"]:
        out.append("paged_blocks: no frames")
    return out


def _check_chunked(result: dict) -> list[str]:
    out = _missing("chunked_prefill.runs", result["runs"], {"off", "on"})
    for mode, run in result["runs"].items():
        out += _missing(f"chunked_prefill.runs.{mode}", run, {"gaps_ms", "max_gap_ms", "p95_gap_ms", "long_ttft_ms"})
    return out


def _check_prefix(result: dict) -> list[str]:
    out = _missing("prefix_caching.runs", result["runs"], {"off", "on"})
    keys = {"ttft_ms", "prefill_tokens", "cached_tokens", "shared_blocks"}
    for mode, run in result["runs"].items():
        out += [p for r in run.get("requests", []) for p in _missing(f"prefix_caching.{mode}.requests[]", r, keys)]
    return out


def _check_attention(result: dict) -> list[str]:
    keys = {"prompt_tokens", "cached_tokens", "cached_positions", "step_ms", "step_ms_median", "kv_bytes_read"}
    out = [p for point in result["points"] for p in _missing("attention_cost.points[]", point, keys)]
    positions = [p.get("cached_positions") for p in result["points"]]
    if not positions or None in positions or positions != sorted(positions) or len(set(positions)) < len(positions):
        out.append(f"attention_cost: cached positions {positions} do not grow")
    if len(positions) > 1 and result["fit"] is None:
        out.append("attention_cost: no fit through several lengths")
    return out + _missing("attention_cost.floor", result["floor"], {"floor_ms", "bandwidth_bytes_s", "weight_bytes"})


def _check_speculative(result: dict) -> list[str]:
    keys = {"kind", "prompt", "steps", "proposed", "accepted", "tokens", "acceptance_rate", "plain_ms", "spec_ms"}
    out = []
    for case in result["cases"]:
        out += _missing("speculative.cases[]", case, keys | {"speedup", "identical"})
        if not out and sum(s["accepted"] + (s["bonus"] is not None) for s in case["steps"]) != case["tokens"]:
            out.append(f"speculative: case {case['kind']}: accepted + bonus tokens != tokens")
    return out


RESULT_CHECKS = {
    "why_batch": _check_why_batch,
    "batching": _check_batching,
    "paged_blocks": _check_paged,
    "chunked_prefill": _check_chunked,
    "prefix_caching": _check_prefix,
    "attention_cost": _check_attention,
    "speculative": _check_speculative,
    "pricing": lambda result: [],
    "batch_invariance": lambda result: _missing("batch_invariance.runs", result["runs"], {"default", "invariant"}),
}


def check_trace(data: Any) -> list[str]:
    """What is wrong with static/data/serving-trace.json (schema 1, one 200 answer per experiment); [] = fits."""
    problems = _missing("trace", data, {"schema", "recorded_on", "experiments"})
    if problems:
        return problems
    if data["schema"] != 1:
        problems.append(f"trace: schema {data['schema']!r} != 1")
    problems += _missing("trace.recorded_on", data["recorded_on"], {"machine", "load_1m", "date", "model"})
    problems += [
        f"trace: no experiment `{n}`" for n in EXPERIMENTS if n not in data["experiments"] and n not in RECORDED_APART
    ]
    for name, body in data["experiments"].items():
        problems += check_response(name, body)
    return problems
