// Pure chart arithmetic (no DOM): extents, linear scales, "nice" ticks, tick labels and histogram
// bins. The SVG helpers in charts.js draw with these; tests can import them on their own.

// [min, max] over finite numbers; `fallback` when there are none. A flat extent is widened so a
// scale never divides by zero.
export function extent(values, fallback = [0, 1]) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (lo === Infinity) return [...fallback];
  if (lo === hi) return lo === 0 ? [0, 1] : [Math.min(0, lo), Math.max(0, hi) || 1];
  return [lo, hi];
}

// Maps the domain [d0, d1] linearly onto the range [r0, r1].
export function linearScale([d0, d1], [r0, r1]) {
  const span = d1 - d0 || 1;
  const scale = (v) => r0 + ((v - d0) / span) * (r1 - r0);
  scale.domain = [d0, d1];
  scale.range = [r0, r1];
  return scale;
}

// Step of 1, 2 or 5 × 10^k that splits [lo, hi] into about `count` intervals.
export function niceStep(lo, hi, count = 5) {
  const raw = Math.abs(hi - lo) / Math.max(1, count);
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const power = 10 ** Math.floor(Math.log10(raw));
  const frac = raw / power;
  const nice = frac <= 1 ? 1 : frac <= 2 ? 2 : frac <= 5 ? 5 : 10;
  return nice * power;
}

// Widens [lo, hi] outwards to whole steps, so axes start and end on a tick.
export function niceDomain([lo, hi], count = 5) {
  const step = niceStep(lo, hi, count);
  return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step];
}

export function ticks([lo, hi], count = 5) {
  const step = niceStep(lo, hi, count);
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  const out = [];
  // Integer multiples, rounded to the step's decimals: no drifting float sums (0.6000000000000001),
  // and `+ 0` turns -0 into 0.
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i += 1) {
    out.push(Number((i * step).toFixed(decimals)) + 0);
  }
  return out;
}

// Short tick labels: 1200 → "1.2k", 3.5e9 → "3.5G", 0.25 → "0.25".
export function formatTick(v) {
  if (v === 0) return '0';
  const abs = Math.abs(v);
  const units = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
  for (const [size, suffix] of units) {
    if (abs >= size) return `${trimZeros((v / size).toFixed(abs / size >= 10 ? 0 : 1))}${suffix}`;
  }
  if (abs >= 1) return trimZeros(v.toFixed(abs >= 10 ? 0 : 1));
  return trimZeros(v.toPrecision(2));
}

function trimZeros(text) {
  return text.includes('.') ? text.replace(/\.?0+$/, '') : text;
}

// Equal-width bins over the values: [{x0, x1, count}], `binCount` of them (fewer for tiny inputs).
export function histogramBins(values, binCount = 12) {
  const finite = values.filter(Number.isFinite);
  if (!finite.length) return [];
  let [lo, hi] = extent(finite);
  if (lo === hi) hi = lo + 1;
  const n = Math.max(1, Math.min(binCount, finite.length));
  const width = (hi - lo) / n;
  const bins = Array.from({ length: n }, (_, i) => ({ x0: lo + i * width, x1: lo + (i + 1) * width, count: 0 }));
  for (const v of finite) bins[Math.min(n - 1, Math.floor((v - lo) / width))].count += 1;
  return bins;
}
