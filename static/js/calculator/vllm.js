// "What vLLM would report": the capacity line vLLM logs at start for the chosen model, block size, cache type and
// KV space (kv-layers.js vllmCapacity), with its arithmetic written out, or why it is not reproduced here.
import { formatInt } from '../shared/format.js';

export function renderVllm(out, vllm, { vlen, vspace }) {
  if (vllm.error) {
    out.line.textContent = `Not reproduced for these inputs: ${vllm.error.reason}.`;
    out.worked.textContent = '';
    return;
  }
  out.line.textContent = `KV cache size: ${formatInt(vllm.tokens)} tokens, `
    + `Maximum concurrency for ${formatInt(vlen)} tokens per request: ${vllm.concurrencyText}x`;
  out.worked.textContent = workedText(vllm, { vlen, vspace });
}

// a ÷ b for whole a ≥ 0, b ≥ 1 as a decimal: exact when it ends within `digits` places, else cut to four places
// and marked "…". BigInt, as a × 10^digits passes 2^53 for large block counts.
export function quotientText(a, b, digits = 9) {
  const A = BigInt(a);
  const B = BigInt(b);
  const whole = A / B;
  let rest = A % B;
  let places = '';
  while (rest !== 0n && places.length < digits) {
    rest *= 10n;
    places += String(rest / B);
    rest %= B;
  }
  const int = formatInt(Number(whole));
  if (rest === 0n) return { text: places ? `${int}.${places}` : int, exact: true };
  return { text: `${int}.${places.slice(0, 4)}…`, exact: false };
}

// The worked sentence: blocks, blocks per request, the unrounded concurrency (and what vLLM prints), and a product
// that gives the tokens figure: concurrency × L when the concurrency is written exactly, else blocks × L ÷ blocks
// per request, both rounded down. vLLM multiplies in floating point; where that lands below the exact product
// (a whole number held as …999), the sentence says so.
export function workedText(vllm, { vlen, vspace }) {
  const { blocks, blocksPerRequest: per, tokens } = vllm;
  const q = quotientText(blocks, per);
  const exactTokens = Number((BigInt(blocks) * BigInt(vlen)) / BigInt(per));
  const product = q.exact
    ? `${q.text} × ${formatInt(vlen)}`
    : `${formatInt(blocks)} × ${formatInt(vlen)} ÷ ${formatInt(per)}`;
  const float = exactTokens === tokens ? '' : ` (vLLM's floating-point product gives ${formatInt(tokens)})`;
  return `${vspace} GiB ÷ ${formatInt(vllm.pageBytes)} B per block per layer ÷ layers = `
    + `${formatInt(blocks)} blocks; each request of ${formatInt(vlen)} tokens takes ${formatInt(per)} of them, `
    + `so ${formatInt(blocks)} ÷ ${formatInt(per)} = ${q.text} requests at once (printed ${vllm.concurrencyText}), `
    + `and ${product} rounded down = ${formatInt(exactTokens)} tokens${float}.`;
}
