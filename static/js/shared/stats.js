// Order statistics over plain numbers, no DOM: the lab's latency percentiles and the walkthrough's
// median step time come from the same definition.

// Percentile with linear interpolation between closest ranks (numpy's default); null when there is
// no finite value.
export function percentile(values, p) {
  const xs = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!xs.length) return null;
  const rank = (Math.min(100, Math.max(0, p)) / 100) * (xs.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo);
}

export function median(values) { return percentile(values, 50); }
