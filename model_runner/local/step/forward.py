"""The batched forward: one packed step (local/model/paged_step.py) for a ragged batch of (request, new
tokens) rows over the paged KV pool, run by the engine's decoder (local/model/decoders.py: the native step or
transformers' paged attention), which writes each row's new keys and values into its blocks and reads its past
from them; the unbatched recompute forward of a request that runs without a KV cache; and `run_step`, one
engine step's passes: when the batched forward fails, each request runs alone, so only those that fail on
their own are reported (the caller ends them)."""

from __future__ import annotations

import logging
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.generation.continuous_batching.utils import build_attention_mask

from model_runner.loading.loader import LoadedModel
from model_runner.loading.quantize import kernel_step, mixed_kernel_rows
from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.model.attention_inspect import make_probe
from model_runner.local.model.paged_step import Decoder, PagedStep
from model_runner.local.scheduler import StepPlan, Work
from model_runner.local.step import prompt_logprobs
from model_runner.local.step.graphs import DecodeGraphs, graphs_wanted
from model_runner.local.step.invariant import Invariance, InvariantSteps, check_kernels
from model_runner.local.step.static_step import StaticDecodeStep, is_decode_batch
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence

log = logging.getLogger("kvscope.engine")

Forward = Callable[[list[Work]], torch.Tensor]  # the batched forward: [rows that want logits, vocab]


def on_kernels(rows: list[Work]) -> bool:
    """Whether a step runs on a quantized route's kernel weights (quantize.kernel_step) rather than letting a
    call of FLOAT_ROWS rows or more take the float32 copies: a decode batch is never a prompt, and a step
    that mixes chunks of chunked prefills with decodes is still cheaper on the kernels while it is small (a
    class's usual step: the few tokens left after a cached prefix, beside 15 decodes). Only chunks: a
    chunked prompt is computed in pieces beside whatever shares its steps anyway, while a whole prompt keeps
    float32's own KV cache whatever shares its step, so without chunked prefill nothing changes."""
    if is_decode_batch(rows):
        return True
    prompts = [row for row in rows if row.kind != "decode"]
    if len(prompts) == len(rows) or not all(row.chunked for row in prompts):
        return False
    return sum(len(row.tokens) for row in rows) <= mixed_kernel_rows()


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


class BatchForward:
    def __init__(self, model, pool: PagedKVPool, decoder: Decoder, cuda_graphs: str = "auto", invariant_rows: int = 0):
        """decoder: what runs each PagedStep (local/model/decoders.py `decoder_for`: native or transformers).
        cuda_graphs: "auto" (decode steps padded and replayed as CUDA graphs on CUDA, eager elsewhere),
        "off" (eager), "padded" (decode steps padded, no graphs: the CPU's test of the graphs' step).
        invariant_rows: batch-invariant mode (step/invariant.py) with decode rows padded to this many; no graphs,
        no inspection, every step row by row."""
        self.model, self.pool, self.decoder = model, pool, decoder
        self.device = model.device
        self.masked = torch.finfo(model.dtype).min
        self.row_by_row = bool(invariant_rows)
        graphs = graphs_wanted(cuda_graphs, self.device) and not invariant_rows
        padded = graphs or cuda_graphs == "padded" or invariant_rows
        self.static = StaticDecodeStep(model, pool, decoder, row_by_row=self.row_by_row) if padded else None
        self.invariant = InvariantSteps(invariant_rows, self._padded, self._eager) if invariant_rows else None
        self.graphs = DecodeGraphs(self.static) if graphs else None
        self.static_steps = 0  # decode steps run padded (replayed or not)
        self.can_inspect = decoder.inspects() and not invariant_rows
        self.inspected: dict[int, dict] = {}  # id(work) → its attention summary, until taken
        self.steer_logits = getattr(model, "steer_logits", None)  # the test model's script, looked up once

    def take_attention(self) -> dict[int, dict]:
        """The attention summaries of the inspected rows run since the last call (id(work) → summary)."""
        taken, self.inspected = self.inspected, {}
        return taken

    def __call__(self, rows: list[Work]) -> torch.Tensor:
        """rows (blocks already reserved) → logits of the rows that want them: [n_wanting, vocab], float32
        on the CPU (one transfer for the step). Each row's tokens sit at positions seq.cached … seq.cached +
        len(tokens) − 1. A decode-only batch runs the static step when there is one; the rest run eagerly."""
        if self.invariant is not None:  # every row at shapes of its own (local/step/invariant.py)
            logits = self.invariant(rows)
        else:
            with kernel_step() if on_kernels(rows) else nullcontext():
                logits = self._static_decode(rows)
                if logits is None:
                    logits = self._eager(rows)
        if self.steer_logits is not None:
            logits = self.steer_logits([row.seq.tokens for row in rows if row.wants_logits], logits)
        return logits.float().cpu()

    def _static_decode(self, rows: list[Work]) -> torch.Tensor | None:
        """The padded decode step (replayed as a graph where there are graphs); None when it does not apply:
        no static step, a prefill or chunk in the batch, an inspected row, or a batch wider than its buffers."""
        if self.static is None or not is_decode_batch(rows) or any(self._inspects(row) for row in rows):
            return None
        return self._padded(rows)

    def _padded(self, rows: list[Work], min_rows: int = 1) -> torch.Tensor | None:
        """A decode batch in the static step, padded to at least min_rows → logits [len(rows), vocab]; None
        when the batch does not fit its buffers."""
        bucket = self.static.fill(rows, min_rows=min_rows)
        if bucket is None:
            return None
        padded = self.graphs.run(bucket) if self.graphs is not None else self.static.run(bucket)
        for row in rows:
            row.seq.cached += 1
        self.static_steps += 1
        return padded[: len(rows)]

    def report(self) -> dict:
        """How decode steps run, for the snapshot and /api/model: the mode, padded steps, graph captures."""
        mode = "graphs" if self.graphs else "invariant" if self.invariant else "padded" if self.static else "eager"
        return {"mode": mode, "static_steps": self.static_steps, **(self.graphs.report() if self.graphs else {})}

    def _eager(self, rows: list[Work]) -> torch.Tensor:
        """Any batch (prefill, chunks, decodes) at its own shapes, the mask built on the host."""
        ids, positions, logit_rows = [], [], []
        cu_q, cu_k = [0], [0]  # cumulative query / key lengths per row
        read, write = [[]], [[]]  # physical slots in the pool's flat tensor
        any_past = any(row.seq.cached for row in rows)
        max_q = max_k = 0
        for row in rows:
            past, q = row.seq.cached, len(row.tokens)
            if q == 0:  # an empty row would shift every later row's logits onto the wrong request
                raise ValueError(f"request {row.seq.id} has no tokens in this step")
            ids += row.tokens
            positions += range(past, past + q)
            cu_q.append(cu_q[-1] + q)
            cu_k.append(cu_k[-1] + past + q)
            max_q, max_k = max(max_q, q), max(max_k, past + q)
            self.pool.cache.extend_read_and_write_indices(row.seq.key, past, q, read if any_past else None, write)
            if row.wants_logits:
                logit_rows.append(cu_q[-1] - 1)
        # Rows that ask for their prompt's logprobs keep every position's logits (none do: nothing changes).
        scored = [row for row in rows if prompt_logprobs.asks(row)]
        wanted, spans = None, []
        if scored:
            logit_rows, wanted, spans = prompt_logprobs.kept_positions(rows, cu_q)
            for row in scored:
                prompt_logprobs.fill_skipped_prefix(self.model, row.seq)
        # Without any past in the batch the keys are this step's tokens only (transformers skips the read).
        keys = cu_k if any_past else cu_q
        probe = make_probe([id(row) if self._inspects(row) else None for row in rows], cu_q, keys)
        device = self.device
        step = PagedStep(
            ids=_i32(ids).to(device),
            positions=_i32(positions).to(device),
            mask=None,
            cu_q=_i32(cu_q).to(device),
            cu_k=_i32(keys).to(device),
            max_q=max_q,
            max_k=max_k,
            write=_i64(write[0]).to(device),
            read=_i64(read[0] if any_past else []).to(device),
            keep=_i64(logit_rows).to(device),
            probe=probe,
            decode_rows=any_past and max_q == 1,
            row_by_row=self.row_by_row,
        )
        if self.decoder.needs_mask(step):
            # Block-diagonal causal mask [1, 1, Q, K]: each row sees its own past and earlier new tokens only.
            mask = torch.full((1, 1, cu_q[-1], keys[-1]), self.masked, dtype=self.model.dtype)
            build_attention_mask(mask, cu_q, keys)
            step.mask = mask.to(device)
        logits = self.decoder.run(step)  # [kept tokens, vocab]
        if probe:
            self.inspected.update(probe.summaries())
        for row, first, end in spans:
            prompt_logprobs.record(row.seq, row.seq.cached, logits[first:end])
        for row in rows:
            row.seq.cached += len(row.tokens)
        return logits if wanted is None else logits[wanted]

    def _inspects(self, row: Work) -> bool:
        """Inspected: a row that yields a token for a request that asked for its attention."""
        return self.can_inspect and row.wants_logits and row.seq.params.inspect_attention


class Forwards:
    """The engine's batched forward of each mode, made when the mode is first used, over one decoder: the
    default, and batch-invariant mode's at the policy's row count then, its kernels checked at it first."""

    def __init__(self, model, pool: PagedKVPool, decoder: Decoder, cuda_graphs: str):
        self.model, self.pool, self.decoder, self.cuda_graphs = model, pool, decoder, cuda_graphs
        self.made: dict[bool, BatchForward] = {}
        self.invariance: Invariance | None = None  # the mode's kernel check, once it was first on

    def of(self, policy: Policy) -> BatchForward:
        if policy.batch_invariant not in self.made:
            rows = policy.max_num_seqs if policy.batch_invariant else 0
            if rows:  # what each kernel on the route gives at the fixed row count
                self.invariance = check_kernels(self.model, rows)
                if not self.invariance.claimed:
                    log.warning("batch-invariant mode: some kernels are not row-independent: %s", self.invariance)
            forward = BatchForward(self.model, self.pool, self.decoder, self.cuda_graphs, invariant_rows=rows)
            self.made[policy.batch_invariant] = forward
        return self.made[policy.batch_invariant]


def recompute_forward(model, seq: Sequence) -> torch.Tensor:
    """No KV cache: every position of the request again, the cost the cache saves. → logits [1, vocab]."""
    ids = _i64([seq.tokens]).to(model.device)  # [1, tokens]
    out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return steer(model, [seq.tokens], out.logits[0, -1:])


def steer(model, histories: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    """Models that script their answer (the test model) bias each row from its token history."""
    hook = getattr(model, "steer_logits", None)
    return hook(histories, logits) if hook is not None else logits


@dataclass
class StepOutput:
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # id(work) → logits row [vocab]
    failures: dict[Sequence, Exception] = field(default_factory=dict)  # requests whose forward failed alone


def run_step(batch: StepPlan, forward: Forward, loaded: LoadedModel, pool: PagedKVPool) -> StepOutput:
    """The step's forward passes; a failed batch is undone and retried request by request."""
    cached = {id(w): w.seq.cached for w in batch.work}  # to undo a failed step's bookkeeping
    try:
        return StepOutput(logits=_run(batch, forward, loaded, pool))
    except Exception as exc:
        for work in batch.work:
            work.seq.cached = cached[id(work)]
        return _isolate_failure(batch, exc, forward, loaded, pool)


def _run(batch: StepPlan, forward: Forward, loaded: LoadedModel, pool: PagedKVPool) -> dict[int, torch.Tensor]:
    rows: dict[int, torch.Tensor] = {}
    if batch.work:
        completing = pool.completing_step([(w.seq, len(w.tokens)) for w in batch.work])
        logits = forward(batch.work)  # [wanting rows, vocab]
        pool.completed_step([w.seq for w in batch.work], completing)
        wanting = [w for w in batch.work if w.wants_logits]
        rows.update({id(w): logits[i] for i, w in enumerate(wanting)})
    for work in batch.recompute:
        rows[id(work)] = recompute_forward(loaded.model, work.seq)[0]
    _sync(loaded.facts.device)
    return rows


def _isolate_failure(
    batch: StepPlan, exc: Exception, forward: Forward, loaded: LoadedModel, pool: PagedKVPool
) -> StepOutput:
    """A batched forward failed: run each request of the step alone, so only the ones that fail
    on their own end with an error and the others carry on (the worker lives on either way)."""
    log.error("model step failed: %s", exc)
    log.debug("%s", traceback.format_exc())
    alone = [StepPlan(work=[w]) for w in batch.work] + [StepPlan(recompute=[w]) for w in batch.recompute]
    out = StepOutput()
    for single in alone:
        seq = (single.work + single.recompute)[0].seq
        cached = seq.cached
        try:
            if len(alone) == 1:
                raise exc
            out.logits.update(_run(single, forward, loaded, pool))
        except Exception as failure:
            seq.cached = cached
            out.failures[seq] = failure
    return out


def _sync(device: str) -> None:
    """Wait for the device, so the step's time is the model's work and not only its launch."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()
