// Pure geometry for the "Attention is not free" figure, no DOM: linear scales, round axis ticks, and the
// chart's model from the attention_cost result (its measured points, the fitted line the server
// computed, the computed weights-only floor). Nothing is re-fitted here: the line is the result's own.

// A linear scale from [d0, d1] onto [r0, r1].
export function linearScale([d0, d1], [r0, r1]) {
  const span = d1 - d0 || 1;
  return (v) => r0 + ((v - d0) / span) * (r1 - r0);
}

// Round ticks from 0 to the first one at or above `max`: a step of 1, 2, 2.5 or 5 × 10^k, at most
// `count` intervals below `max` (one more may end the axis above it).
export function ticks(max, count = 4) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [0];
  while (out[out.length - 1] < max) out.push(Number((out.length * step).toPrecision(12)));
  return out;
}

// The fitted line's ms at `positions` cached positions: intercept + slope (given in µs per 1,000 positions).
export function fitAt(fit, positions) {
  return fit.intercept_ms + (fit.slope_us_per_1k_positions / 1e6) * positions;
}

// What the figure draws: the timed lengths (best and median step at their mean cached positions), the
// fitted line from no cache to the longest length, the weights-only floor, and the axes' ranges.
export function chartModel(result) {
  const points = (result.points || []).filter((p) => Number.isFinite(p.step_ms) && Number.isFinite(p.cached_positions))
    .map((p) => ({ positions: p.cached_positions, best: p.step_ms, median: p.step_ms_median, target: p.target,
      prompt: p.prompt_tokens, kvBytes: p.kv_bytes_read, atLimit: !!p.at_limit }));
  const xMax = ticks(Math.max(1, ...points.map((p) => p.positions))).at(-1);
  const fit = result.fit && Number.isFinite(result.fit.intercept_ms)
    ? { x0: 0, y0: fitAt(result.fit, 0), x1: xMax, y1: fitAt(result.fit, xMax) } : null;
  const floor = Number.isFinite(result.floor?.floor_ms) ? result.floor.floor_ms : null;
  const tops = [...points.map((p) => Math.max(p.best, p.median ?? 0)), floor ?? 0, fit ? Math.max(fit.y0, fit.y1) : 0];
  const yTicks = ticks(Math.max(...tops) * 1.05);
  return { points, fit, floor, xTicks: ticks(xMax), yTicks, xMax, yMax: yTicks.at(-1) };
}
