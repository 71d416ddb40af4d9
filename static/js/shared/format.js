// Number, byte and time formatting for every figure, no DOM. One convention page-wide: en-US digit
// grouping, binary units (KiB = 2^10 B, MiB = 2^20 B, GiB = 2^30 B, TiB = 2^40 B), and MISSING for
// a value that is not known (yet), so "no number" reads the same in the walkthrough, calculator and lab.

export const MISSING = '–';

const INT = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
const TWO = new Intl.NumberFormat('en-US', { maximumFractionDigits: 2 });
const UNITS = [['TiB', 1024 ** 4], ['GiB', 1024 ** 3], ['MiB', 1024 ** 2], ['KiB', 1024]];

const known = (v) => typeof v === 'number' && Number.isFinite(v);

export const UNIT_NAMES = {
  B: 'bytes', KiB: 'kibibytes (2^10 bytes)', MiB: 'mebibytes (2^20 bytes)',
  GiB: 'gibibytes (2^30 bytes)', TiB: 'tebibytes (2^40 bytes)',
};

// 1234.6 → "1,235".
export function formatInt(n, missing = MISSING) {
  return known(n) ? INT.format(Math.round(n)) : missing;
}

// A fixed number of decimals, no grouping: 3.14159 → "3.1".
export function formatFixed(v, digits = 1, missing = MISSING) {
  return known(v) ? v.toFixed(digits) : missing;
}

// "3 tokens", "1 token", "1,024 tokens".
export function plural(n, one, many = `${one}s`) {
  return `${INT.format(n)} ${n === 1 ? one : many}`;
}

// An exact byte count: "5,033,164,800 B".
export function formatBytes(n) {
  return `${INT.format(n)} B`;
}

// {number: "4.69", unit: "GiB", exact: false, text: "≈ 4.69 GiB"}: the largest unit keeping the
// value ≥ 1, marked "≈" whenever two decimals round.
export function binary(n) {
  const [unit, size] = UNITS.find(([, s]) => n >= s) || ['B', 1];
  const value = n / size;
  const number = TWO.format(value);
  const exact = Math.round(value * 100) / 100 === value;
  return { number, unit, exact, text: `${exact ? '' : '≈ '}${number} ${unit}` };
}

// A size read at a glance, in prose and figure labels: "46.1 KiB", "135 MiB", "512 B".
export function formatSize(b, missing = MISSING) {
  if (!known(b)) return missing;
  for (const [unit, size] of UNITS.slice(1)) if (b >= size) return `${(b / size).toFixed(b >= 100 * size ? 0 : 1)} ${unit}`;
  return `${INT.format(Math.round(b))} B`;
}

// Milliseconds. With `digits` the value is fixed to that many decimals ("12.3 ms", the lab's
// metric tables); without it the precision follows the size, so a 0.42 ms queue wait and a 12 s
// answer both read sensibly ("0.42 ms", "12.3 ms", "1,234 ms", "12.3 s").
export function formatMs(ms, { digits = null, missing = MISSING } = {}) {
  if (!known(ms)) return missing;
  if (digits != null) return `${ms.toFixed(digits)} ms`;
  if (ms >= 10000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms >= 100) return `${INT.format(Math.round(ms))} ms`;
  if (ms >= 10) return `${ms.toFixed(1)} ms`;
  return `${ms.toFixed(2)} ms`;
}

// "8.03" billion parameters, trimmed: a number field's view of an exact parameter count.
export function billions(params) {
  return params == null ? '' : String(Math.round(params / 1e6) / 1e3);
}
