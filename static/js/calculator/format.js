// Number formatting for the calculator, no DOM: exact byte counts with separators, and binary units
// (KiB = 2^10 B, MiB = 2^20 B, GiB = 2^30 B, TiB = 2^40 B) marked "≈" whenever two decimals round.

const INT = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
const TWO = new Intl.NumberFormat('en-US', { maximumFractionDigits: 2 });
const UNITS = [['TiB', 1024 ** 4], ['GiB', 1024 ** 3], ['MiB', 1024 ** 2], ['KiB', 1024]];

export const UNIT_NAMES = {
  B: 'bytes', KiB: 'kibibytes (2^10 bytes)', MiB: 'mebibytes (2^20 bytes)',
  GiB: 'gibibytes (2^30 bytes)', TiB: 'tebibytes (2^40 bytes)',
};

export function formatInt(n) {
  return INT.format(n);
}

export function formatBytes(n) {
  return `${INT.format(n)} B`;
}

// {number: "4.69", unit: "GiB", exact: false, text: "≈ 4.69 GiB"}: the largest unit keeping the value ≥ 1.
export function binary(n) {
  const [unit, size] = UNITS.find(([, s]) => n >= s) || ['B', 1];
  const value = n / size;
  const number = TWO.format(value);
  const exact = Math.round(value * 100) / 100 === value;
  return { number, unit, exact, text: `${exact ? '' : '≈ '}${number} ${unit}` };
}

export function plural(n, one, many = `${one}s`) {
  return `${INT.format(n)} ${n === 1 ? one : many}`;
}

// "8.03" billion parameters, trimmed: the input field's view of an exact parameter count.
export function billions(params) {
  return params == null ? '' : String(Math.round(params / 1e6) / 1e3);
}
