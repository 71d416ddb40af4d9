// KV-cache arithmetic, no DOM: the browser twin of formulas/kv_math.py, checked against the same
// golden cases (static/data/kv_golden.json). All sizes are whole bytes; inputs are bounded so every
// product stays below 2^53 and double arithmetic is exact.

export const KIB = 1024;
export const MIB = 1024 ** 2;
export const GIB = 1024 ** 3;

export function kvBytesPerToken({ layers, kvHeads, headDim, bytesPerElement }) {
  return Math.trunc(2 * layers * kvHeads * headDim * bytesPerElement);
}

export function kvCacheBytes(arch, tokens, sequences = 1) {
  return kvBytesPerToken(arch) * tokens * sequences;
}

// Positions a paged cache holds for one request: whole blocks, the last one partly empty.
export function pagedTokens(length, blockSize) {
  return Math.ceil(length / blockSize) * blockSize;
}

// Reserved vs used for a mix of request lengths. Contiguous reserves maxTokens per request up front;
// paged holds whole blocks. A length above maxTokens is cut to it: a request cannot outgrow its room.
export function allocation(lengths, blockSize, maxTokens, bytesPerToken) {
  const cut = lengths.map((n) => Math.min(n, maxTokens));
  const used = cut.reduce((a, n) => a + n, 0);
  const paged = cut.reduce((a, n) => a + pagedTokens(n, blockSize), 0);
  const contiguous = maxTokens * cut.length;
  return {
    lengths: cut,
    usedTokens: used, pagedTokens: paged, contiguousTokens: contiguous,
    usedBytes: used * bytesPerToken, pagedBytes: paged * bytesPerToken, contiguousBytes: contiguous * bytesPerToken,
  };
}

// Half a byte still takes its nibble, so int4 weights round up (as in kv_math.weights_bytes).
export function weightsBytes(params, bytesPerElement) {
  return Math.ceil(params * bytesPerElement);
}

// floor(a / b) for non-negative integers, corrected for the rounding of a / b near 2^53.
function floorDiv(a, b) {
  let q = Math.floor(a / b);
  if (q * b > a) q -= 1;
  else if ((q + 1) * b <= a) q += 1;
  return q;
}

export function maxSequences(memoryBytes, weights, bytesPerToken, tokens) {
  return Math.max(0, floorDiv(memoryBytes - weights, bytesPerToken * tokens));
}

export function maxTokens(memoryBytes, weights, bytesPerToken, sequences) {
  return Math.max(0, floorDiv(memoryBytes - weights, bytesPerToken * sequences));
}

// MHA: one KV head per query head; GQA: groups of query heads share one; MQA: all share one.
// null when the query-head count is not given or does not fit the KV heads.
export function attentionKind(attentionHeads, kvHeads) {
  if (!attentionHeads || kvHeads > attentionHeads) return null;
  if (kvHeads === attentionHeads) return 'MHA';
  if (kvHeads === 1) return 'MQA';
  return 'GQA';
}
