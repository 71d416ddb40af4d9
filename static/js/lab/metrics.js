// Pure latency and throughput arithmetic over a request's server events (no DOM). Definitions
// follow vLLM's, as docs/protocol.md states: TTFT = submit → first token; TPOT = (E2E − TTFT) /
// (tokens − 1); ITL = every gap between consecutive tokens. All times are the server's `t_ms`.
import { EVENT, isTerminal } from '../shared/protocol.js';
import { median, percentile } from '../shared/stats.js';

export { median, percentile };

// Gaps between consecutive token times.
export function interTokenLatencies(tokenTimes) {
  const gaps = [];
  for (let i = 1; i < tokenTimes.length; i += 1) gaps.push(tokenTimes[i] - tokenTimes[i - 1]);
  return gaps;
}

export function timePerOutputToken(e2eMs, ttftMs, tokens) {
  if (!(tokens > 1) || !Number.isFinite(e2eMs) || !Number.isFinite(ttftMs)) return null;
  return (e2eMs - ttftMs) / (tokens - 1);
}

// Theil–Sen slope of y against x: the median of the slopes between every pair of points. One step
// slowed by another process barely moves it, where it could flip a least-squares fit. Null with
// fewer than two distinct x values.
export function robustSlope(points) {
  const slopes = [];
  for (let i = 0; i < points.length; i += 1) {
    for (let j = i + 1; j < points.length; j += 1) {
      const dx = points[j].x - points[i].x;
      if (dx !== 0) slopes.push((points[j].y - points[i].y) / dx);
    }
  }
  return median(slopes);
}

// The one prefill FLOP count, the same as bench/baselines.py Shape.prefill_flops (golden cases in
// static/data/kv_golden.json `prefill_flops`, checked against both): 2 × non-embedding parameters per
// prompt token, plus causal attention (about T²/2 query-key pairs per head and layer, 2 × head dim
// FLOPs each for the scores and again for the weighted sum), plus ONE row of logits (2 × vocab ×
// hidden): the engine computes logits for the last position only. The embedding lookup is free.
// `shape` holds params, layers, attention_heads, head_dim, hidden_size, vocab_size and
// tied_embeddings (whether the output layer reuses the input embedding, counted once in params;
// true when not given: both models this site ships tie them).
export function prefillFlops(shape, tokens) {
  const { params, layers, attention_heads: heads, head_dim: headDim, hidden_size: hidden, vocab_size: vocab } = shape || {};
  if (![params, layers, heads, headDim, hidden, vocab].every((x) => x > 0) || !(tokens > 0)) return null;
  const embedding = vocab * hidden;
  const nonEmbedding = params - embedding * ((shape.tied_embeddings ?? true) ? 1 : 2);
  const attention = 2 * layers * tokens * tokens * heads * headDim;
  return 2 * nonEmbedding * tokens + attention + 2 * embedding;
}

// Achieved prefill FLOP/s: prefillFlops ÷ the measured prefill time (an estimate: the count is computed).
export function prefillFlopsPerS(shape, promptTokens, prefillMs) {
  const flops = prefillFlops(shape, promptTokens);
  if (flops === null || !(prefillMs > 0)) return null;
  return flops / (prefillMs / 1000);
}

// Estimate: one decode step reads every weight once plus the whole KV cache, so bytes per step ≈
// weights_bytes + cache bytes; divided by the measured step time it gives the achieved bandwidth.
export function decodeBytesPerS(weightsBytes, cacheBytes, stepMs) {
  if (!(weightsBytes > 0) || !(stepMs > 0)) return null;
  return (weightsBytes + (cacheBytes || 0)) / (stepMs / 1000);
}

// A decode step does ≈ 2 × params FLOPs for its one token.
export function decodeFlopsPerS(params, stepMs) {
  if (!(params > 0) || !(stepMs > 0)) return null;
  return (2 * params) / (stepMs / 1000);
}

// Every metric the lab shows, from the events seen so far: it works mid-run too, with E2E, TPOT
// and tokens/s left null until the terminal event. An `error` has no E2E: nothing was answered.
export function summarize(events) {
  const tokens = events.filter((e) => e.type === EVENT.TOKEN);
  const byType = (type) => events.find((e) => e.type === type);
  const prefillStart = byType(EVENT.PREFILL_START);
  const prefillEnd = byType(EVENT.PREFILL_END);
  const accepted = byType(EVENT.ACCEPTED);
  const terminal = events.find((e) => isTerminal(e.type));
  const times = tokens.map((t) => t.t_ms);
  const itl = interTokenLatencies(times);
  const ttft = tokens.length ? tokens[0].t_ms : null;
  const e2e = terminal && terminal.type !== EVENT.ERROR ? terminal.t_ms : null;
  const count = terminal && Number.isInteger(terminal.tokens) ? terminal.tokens : tokens.length;
  const tpot = timePerOutputToken(e2e, ttft, count);
  const last = tokens[tokens.length - 1] || prefillEnd;
  const steps = tokens.filter((t) => t.index > 0).map((t) => t.step_ms);
  const firstText = tokens.find((t) => t.text);
  return {
    promptTokens: accepted ? accepted.prompt_tokens : prefillStart ? prefillStart.prompt_tokens : null,
    contentTokens: accepted ? accepted.content_tokens : null,
    templateTokens: accepted ? accepted.template_tokens : null,
    tokens: count,
    queueMs: prefillStart ? prefillStart.t_ms : null,
    prefillMs: prefillEnd ? prefillEnd.ms : null,
    ttftMs: ttft,
    tpotMs: tpot,
    itlMs: itl,
    itlP50: percentile(itl, 50),
    itlP90: percentile(itl, 90),
    itlP99: percentile(itl, 99),
    e2eMs: e2e,
    decodeTokensPerS: tpot ? 1000 / tpot : null,
    firstTextMs: firstText ? firstText.t_ms : terminal && terminal.text ? terminal.t_ms : null,
    stepMsMedian: median(steps),
    cacheTokens: last ? last.cache_tokens : null,
    cacheBytesMeasured: last ? last.cache_bytes_measured : null,
    cacheBytesFormula: last ? last.cache_bytes_formula : null,
  };
}

// Per-token series for the charts: step time by position and cache bytes by position.
export function tokenSeries(events) {
  const out = [];
  for (const e of events) {
    if (e.type !== EVENT.TOKEN) continue;
    out.push({
      index: e.index, position: e.cache_tokens, stepMs: e.step_ms, tMs: e.t_ms,
      bytesMeasured: e.cache_bytes_measured, bytesFormula: e.cache_bytes_formula,
    });
  }
  return out;
}
