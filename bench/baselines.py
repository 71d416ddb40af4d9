"""What the engine is held to, on the same model object: a bare greedy loop (model + DynamicCache +
argmax, the floor), transformers `generate` with a TextIteratorStreamer read from another thread
(what a user writes by hand), transformers' own continuous batching; one repetition's comparison of the
engine with them, and the estimates that relate a measured time to the machine's ceilings (measured by
serving_experiments/roofline.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from formulas import cost
from model_runner.protocol.metrics import percentile

now = time.monotonic


@dataclass
class LoopRun:
    """One baseline generation: token ids, and the stamp taken as each token became known."""

    name: str
    token_ids: list[int] = field(default_factory=list)
    start: float = 0.0
    token_at: list[float] = field(default_factory=list)
    end: float = 0.0  # the caller holds the whole answer

    @property
    def prefill_ms(self) -> float | None:
        return (self.token_at[0] - self.start) * 1000 if self.token_at else None

    @property
    def step_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.token_at, self.token_at[1:])]

    @property
    def tokens_per_s(self) -> float | None:
        span = self.end - self.start
        return len(self.token_ids) / span if self.token_ids and span > 0 else None

    def summary(self) -> dict[str, Any]:
        return summary(len(self.token_ids), self.prefill_ms, self.step_ms, self.tokens_per_s)


def summary(tokens: int, prefill_ms: float | None, steps: list[float], tokens_per_s: float | None) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "prefill_ms": _round(prefill_ms),
        "step_ms_median": _round(percentile(steps, 50)),
        "step_ms_p10": _round(percentile(steps, 10)),
        "tokens_per_s": _round(tokens_per_s),
    }


def bare_greedy_loop(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> LoopRun:
    """The floor: prefill, then one forward + argmax per token, stopping at an end token like the engine."""
    from transformers import DynamicCache

    from model_runner.local.step.forward import steer

    device = model.device
    run = LoopRun("bare_loop")
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, prompt]
        run.start = now()
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits  # [1, 1, vocab]
        while True:
            # steer: a no-op for real models; the scripted test model picks its answer's next byte there
            last = steer(model, [prompt_ids + run.token_ids], logits[0, -1:])  # [1, vocab]
            token = int(last[0].argmax())  # int() waits for the device: the step is really done
            run.token_ids.append(token)
            run.token_at.append(now())
            if token in eos_ids or len(run.token_ids) >= max_new_tokens:
                break
            step = torch.tensor([[token]], dtype=torch.long, device=device)  # [1, 1]
            logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits
    run.end = now()
    return run


def generate_streamer_unavailable(model, hf_tokenizer) -> str | None:
    """Why the generate baseline cannot run on this model (the test model has no generate()), or None."""
    if not hasattr(model, "generate"):
        return "this model has no transformers generate() (the fake test model)"
    if hf_tokenizer is None:
        return "this model's tokenizer is not a transformers tokenizer"
    return None


def generate_with_streamer(
    model, hf_tokenizer, messages: list[dict[str, str]], max_new_tokens: int, eos_ids: frozenset[int]
) -> LoopRun:
    """transformers generate() on a thread, its TextIteratorStreamer read here, greedy, as its docs
    show. The clock starts before the chat template is applied, as the engine's starts at submit."""
    from transformers import TextIteratorStreamer

    run = LoopRun("generate_streamer")

    class StampingStreamer(TextIteratorStreamer):
        """Notes when each generated token reaches the streamer (one clock read per token)."""

        def put(self, value):
            if not self.next_tokens_are_prompt:
                run.token_at.append(now())
            super().put(value)

    result: dict[str, Any] = {}

    def work(**kwargs) -> None:
        try:
            result["out"] = model.generate(**kwargs)
        except BaseException as exc:  # surfaced in the caller's thread below
            result["error"] = exc
            streamer.end()

    with torch.inference_mode():
        run.start = now()
        inputs = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(model.device)
        streamer = StampingStreamer(hf_tokenizer, skip_prompt=True, skip_special_tokens=True)
        eos = sorted(eos_ids)
        thread = threading.Thread(
            target=work,
            name="bench-generate",
            kwargs=dict(
                **inputs,
                streamer=streamer,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                eos_token_id=eos,
                pad_token_id=eos[0],
            ),
        )
        thread.start()
        for _ in streamer:  # the caller reads the text as it comes
            pass
        thread.join()
        run.end = now()
    if "error" in result:
        raise result["error"]
    prompt_len = inputs["input_ids"].shape[1]
    run.token_ids = result["out"][0, prompt_len:].tolist()
    return run


# ---- estimates (computed by the cost model from the model's shape, not measured) -------------------


def estimates(
    shape: cost.Shape, prompt_tokens: int, prefill_ms: float | None, step_ms: float | None, context: float
) -> dict[str, Any]:
    """Achieved prefill FLOP/s and decode bandwidth: formulas/cost.py's counts over measured times."""
    out: dict[str, Any] = {"prefill_gflop_per_s": None, "decode_gb_per_s": None}
    if prefill_ms:
        out["prefill_gflop_per_s"] = round(cost.prefill_flops(shape, prompt_tokens) / (prefill_ms / 1000) / 1e9, 3)
    if step_ms:
        out["decode_gb_per_s"] = round(cost.decode_step_bytes(shape, 1, context) / (step_ms / 1000) / 1e9, 3)
    return out


def fractions(est: dict[str, Any], ceilings: dict[str, Any]) -> dict[str, Any]:
    """The estimates as fractions of the machine's measured matmul rate and copy bandwidth."""

    def part(x: float | None, ceiling: float) -> float | None:
        return None if x is None else round(x / ceiling, 4)

    return {
        **est,
        "prefill_fraction_of_matmul": part(est["prefill_gflop_per_s"], ceilings["matmul_gflop_per_s"]),
        "decode_fraction_of_copy": part(est["decode_gb_per_s"], ceilings["copy_gb_per_s"]),
    }


# ---- one repetition's comparison ------------------------------------------------------------------


def engine_summary(record) -> dict[str, Any] | None:
    """The engine's side of a comparison (a completed RequestRecord), plus its per-token work outside the
    model step."""
    if record.outcome != "completed":
        return None
    n = len(record.token_ids)
    out = summary(n, record.prefill_ms, record.engine_itl_ms, n / (record.e2e_ms / 1000))
    model = record.step_ms[1:]  # token k's step_ms: its forward and sampling; token 0 came from prefill
    outside = [gap - step for gap, step in zip(record.engine_itl_ms, model)]
    out["model_step_ms_median"] = _round(percentile(model, 50))
    out["outside_model_ms_median"] = _round(percentile(outside, 50))
    return out


def comparison(
    shape: cost.Shape, prompt_tokens: int, record, results: dict[str, Any], generate_skip: str | None
) -> dict[str, Any]:
    """One repetition of the engine (its RequestRecord) beside the bare loop and generate() (their LoopRuns
    in `results`): each side's summary, whether their greedy answers are the same, the ratios between them
    and the estimates from the engine's times."""
    engine = engine_summary(record)
    bare, gen = results.get("bare_loop"), results.get("generate_streamer")
    runs = {
        "engine": engine,
        "bare_loop": bare.summary() if bare else None,
        "generate_streamer": gen.summary() if gen else None,
    }
    identical = None
    if engine and bare:
        identical = record.token_ids == bare.token_ids and (gen is None or gen.token_ids == bare.token_ids)
    ratios = {
        "engine_step_over_bare": _ratio(engine, runs["bare_loop"], "step_ms_median"),
        "engine_step_over_bare_p10": _ratio(engine, runs["bare_loop"], "step_ms_p10"),
        "engine_tps_over_generate": _ratio(engine, runs["generate_streamer"], "tokens_per_s"),
        "bare_tps_over_generate": _ratio(runs["bare_loop"], runs["generate_streamer"], "tokens_per_s"),
        "engine_outside_over_model": _ratio(engine, engine, "outside_model_ms_median", "model_step_ms_median"),
    }
    est = None
    if engine:
        mid_answer = prompt_tokens + engine["tokens"] / 2
        est = estimates(shape, prompt_tokens, engine["prefill_ms"], engine["step_ms_median"], mid_answer)
    return {
        **runs,
        "generate_streamer_skipped": generate_skip,
        "greedy_identical": identical,
        "estimates": est,
        "ratios": ratios,
    }


def _ratio(a: dict | None, b: dict | None, key: str, b_key: str | None = None) -> float | None:
    b_key = b_key or key
    if not a or not b or a.get(key) is None or not b.get(b_key):
        return None
    return round(a[key] / b[b_key], 4)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# ---- transformers' own continuous batching -------------------------------------------------------


@dataclass
class BatchRun:
    """transformers' ContinuousBatchingManager on a list of prompts: tokens per prompt (input order);
    `wall_s`, its generation span (the first request created -> the last one finished, as the
    manager stamps them), and `call_s`, the whole `generate_batch` call (manager start and stop too)."""

    token_ids: list[list[int]]
    wall_s: float
    call_s: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


def generate_batch_unavailable(model) -> str | None:
    """Why transformers' generate_batch cannot run on this model (the scripted test model), or None."""
    if not hasattr(model, "generate_batch"):
        return "this model has no transformers generate_batch() (the fake test model)"
    return None


def hf_generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_ids: frozenset[int],
    num_blocks: int,
    block_size: int,
    max_batch_tokens: int,
) -> BatchRun:
    """transformers' continuous batching (`model.generate_batch`), greedy, with the engine's page size,
    pool size and token budget (on a CPU both must be given: its defaults size them for a GPU)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    eos = sorted(eos_ids)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[0])
    cb = ContinuousBatchingConfig(
        page_size=block_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, allow_block_sharing=False
    )
    # The engine's transformers decoder leaves kvscope's sdpa on the model (transformers' own unless a request is
    # inspected), which the manager refuses by name: it runs on transformers' sdpa, and the engine's is put back.
    attention = model.config._attn_implementation
    if attention != "sdpa":
        model.set_attn_implementation("sdpa")
    try:
        t0 = now()
        out = model.generate_batch(
            [list(p) for p in prompts],
            generation_config=config,
            continuous_batching_config=cb,
            max_new_tokens=max_new_tokens,
        )
        call = now() - t0
    finally:
        if attention != "sdpa":
            model.set_attn_implementation(attention)
    if len(out) != len(prompts):
        raise RuntimeError(f"generate_batch returned {len(out)} results for {len(prompts)} prompts")
    results = list(out.values())
    failed = [o.error for o in results if o.error]
    if failed:
        raise RuntimeError(f"generate_batch: {len(failed)} requests failed: {failed[0]}")
    # perf_counter stamps; after the last request finishes the call still polls and stops its thread
    span = max(o.lifespan[1] for o in results) - min(o.created_time for o in results)
    return BatchRun([list(o.generated_tokens) for o in results], span if span > 0 else call, call)
