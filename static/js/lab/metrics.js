// Pure latency and throughput arithmetic over a request's server events (no DOM). Definitions
// follow vLLM's, as docs/protocol.md states: TTFT = submit → first token; TPOT = (E2E − TTFT) /
// (tokens − 1); ITL = every gap between consecutive tokens. All times are the server's `t_ms`.
import { EVENT, isTerminal } from '../shared/protocol.js';
import { median, percentile } from '../shared/stats.js';
import { decodeFlops, decodeStepBytes, decodeTokensPerS, perSecond, prefillFlops } from '../shared/cost.js';

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

// Estimates for the lab's rows: the cost model's counts (shared/cost.js, the twin of formulas/cost.py,
// golden cases in static/data/cost_golden.json) over a measured time. `facts` is /api/model's; its
// `cost_shape` is the model's Shape as it runs (absent for a remote engine, whose layers the page cannot
// see: then every estimate is null rather than a guess).
const shapeOf = (facts) => (facts && facts.cost_shape && facts.cost_shape.route ? facts.cost_shape : null);

// Achieved prefill FLOP/s: the prefill's FLOPs (one row of logits) over its measured time.
export function prefillFlopsPerS(facts, promptTokens, prefillMs) {
  const shape = shapeOf(facts);
  if (!shape || !Number.isInteger(promptTokens) || promptTokens < 1) return null;
  return perSecond(prefillFlops(shape, promptTokens), prefillMs);
}

// Achieved decode bandwidth: the bytes a step reads (the weights as the route stores them — not the
// untouched embedding, one row of it — and the KV cache at `context` positions) over the step's time.
export function decodeBytesPerS(facts, context, stepMs) {
  const shape = shapeOf(facts);
  if (!shape || !(context >= 0)) return null;
  return perSecond(decodeStepBytes(shape, 1, context), stepMs);
}

// Achieved decode FLOP/s: 2 × the multiplied weights and the head, plus attention over `context`.
export function decodeFlopsPerS(facts, context, stepMs) {
  const shape = shapeOf(facts);
  if (!shape || !(context >= 0)) return null;
  return perSecond(decodeFlops(shape, context), stepMs);
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
    // (n − 1) / (t_last − t_first), the one decode tokens/s (1000 / TPOT also counts the time after the last token)
    decodeTokensPerS: e2e !== null ? decodeTokensPerS(times.map((t) => t / 1000)) : null,
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
