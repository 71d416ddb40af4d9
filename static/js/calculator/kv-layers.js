// KV-cache bytes for a model as layer groups, no DOM: the browser twin of formulas/kv_layers.py, checked
// against the same golden cases (static/data/kv_golden.json `layer_cases`). Groups and storage use the
// Python names (snake_case keys in the data), results are camelCase. Every result is a whole number of
// bytes below 2^53, so double arithmetic is exact; a total beyond that is an error naming `tokens`.

export const ELEMENT_BITS = { fp32: 32, fp16: 16, fp8: 8, fp8_e5m2: 8, int8: 8, int4: 4 };
export const KINDS = ['full', 'sliding', 'chunked', 'mla', 'state', 'shared'];
export const SCALES = ['none', 'tensor', 'head', 'group'];
const ATTENTION = ['full', 'sliding', 'chunked'];
const STORAGE_DEFAULTS = { kv_dtype: 'fp16', scale: 'none', group_size: 32, scale_bytes: 2, block_size: 1, tp: 1, state_bytes: 2 };

// Bad input: `field` names it, the message states the limit (KvInputError in Python).
export class KvInputError extends Error {
  constructor(field, message) {
    super(`${field}: ${message}`);
    this.field = field;
    this.reason = message;
  }
}

function whole(v, lo, hi, field) {
  if (!Number.isInteger(v) || v < lo || v > hi) {
    throw new KvInputError(field, `must be a whole number from ${lo.toLocaleString('en-US')} to ${hi.toLocaleString('en-US')} (got ${JSON.stringify(v)})`);
  }
  return v;
}

export function storageOf(d = {}) {
  const s = { ...STORAGE_DEFAULTS, ...d };
  if (!(s.kv_dtype in ELEMENT_BITS)) throw new KvInputError('kv_dtype', `unknown element type ${JSON.stringify(s.kv_dtype)}`);
  if (!SCALES.includes(s.scale)) throw new KvInputError('scale', `must be one of ${SCALES.join(', ')}`);
  for (const [key, lo, hi] of [['group_size', 1, 65536], ['scale_bytes', 1, 8], ['block_size', 1, 4096], ['tp', 1, 1024], ['state_bytes', 1, 8]]) {
    whole(s[key], lo, hi, key);
  }
  return s;
}

function checkGroup(g, i) {
  const at = `groups[${i}]`;
  if (!KINDS.includes(g.kind)) throw new KvInputError(`${at}.kind`, `unknown kind ${JSON.stringify(g.kind)}; known: ${KINDS.join(', ')}`);
  whole(g.layers, 1, 4096, `${at}.layers`);
  if (ATTENTION.includes(g.kind)) {
    whole(g.kv_heads, 1, 4096, `${at}.kv_heads`);
    whole(g.head_dim, 1, 65536, `${at}.head_dim`);
  }
  if (g.kind === 'sliding') whole(g.window, 1, 2 ** 30, `${at}.window`);
  if (g.kind === 'chunked') whole(g.chunk, 1, 2 ** 30, `${at}.chunk`);
  if (g.kind === 'mla') {
    whole(g.latent, 1, 65536, `${at}.latent`);
    whole(g.rope_dim, 0, 65536, `${at}.rope_dim`);
  }
  if (g.kind === 'state') {
    whole(g.conv, 0, 2 ** 40, `${at}.conv`);
    whole(g.state, 0, 2 ** 40, `${at}.state`);
  }
}

// max(1, heads / TP): heads split over the GPUs, replicated once TP exceeds them.
export function kvHeadsPerGpu(kvHeads, tp) {
  if ((tp <= kvHeads && kvHeads % tp) || (tp > kvHeads && tp % kvHeads)) {
    throw new KvInputError('tp', `${tp} GPUs cannot split ${kvHeads} KV heads evenly (nor replicate them evenly)`);
  }
  return Math.max(1, Math.floor(kvHeads / tp));
}

const vectorBytes = (elements, bits) => Math.ceil((elements * bits) / 8);

function scaleBytesPerToken(vectors, width, s) {
  if (s.scale === 'head') return vectors * s.scale_bytes;
  if (s.scale === 'group') return vectors * Math.ceil(width / s.group_size) * s.scale_bytes;
  return 0;
}

// Bytes one cached position takes in one layer of group `g`, on one GPU.
export function layerTokenBytes(g, s) {
  const bits = ELEMENT_BITS[s.kv_dtype];
  if (g.kind === 'mla') {
    const width = g.latent + g.rope_dim;
    return vectorBytes(width, bits) + scaleBytesPerToken(1, width, s);
  }
  if (!ATTENTION.includes(g.kind)) return 0;
  const heads = kvHeadsPerGpu(g.kv_heads, s.tp);
  return 2 * vectorBytes(heads * g.head_dim, bits) + scaleBytesPerToken(2 * heads, g.head_dim, s);
}

export function positionsHeld(g, tokens) {
  if (g.kind === 'sliding') return Math.min(tokens, g.window);
  if (g.kind === 'chunked') return Math.min(tokens, g.chunk);
  return g.kind === 'full' || g.kind === 'mla' ? tokens : 0;
}

function fixedScaleBytes(g, s) {
  if (s.scale !== 'tensor' || !(ATTENTION.includes(g.kind) || g.kind === 'mla')) return 0;
  return g.layers * (g.kind === 'mla' ? 1 : 2) * s.scale_bytes;
}

function groupBytes(g, tokens, s) {
  const held = positionsHeld(g, tokens);
  const allocated = Math.ceil(held / s.block_size) * s.block_size;
  const perLayerToken = layerTokenBytes(g, s);
  const state = g.kind === 'state' ? g.layers * Math.ceil((g.conv + g.state) / s.tp) * s.state_bytes : 0;
  return {
    kind: g.kind, layers: g.layers, layerTokenBytes: perLayerToken, positionsHeld: held, positionsAllocated: allocated,
    sequenceBytes: g.layers * allocated * perLayerToken + state, stateBytes: state, fixedBytes: fixedScaleBytes(g, s),
  };
}

// Exact cache bytes for `sequences` sequences of `tokens` positions: per GPU and over all TP GPUs.
export function cacheBytes(groups, tokens, sequences, storage) {
  const s = storageOf(storage);
  if (!groups || !groups.length) throw new KvInputError('groups', 'a model needs at least one layer group');
  groups.forEach(checkGroup);
  whole(tokens, 0, 2 ** 30, 'tokens');
  whole(sequences, 1, 2 ** 20, 'sequences');
  const parts = groups.map((g) => groupBytes(g, tokens, s));
  const seqGpu = parts.reduce((a, p) => a + p.sequenceBytes, 0);
  const fixedGpu = parts.reduce((a, p) => a + p.fixedBytes, 0);
  const totalGpu = seqGpu * sequences + fixedGpu;
  if (totalGpu * s.tp > Number.MAX_SAFE_INTEGER) {
    throw new KvInputError('tokens', 'the total passes 2^53 bytes (8 PiB), beyond exact arithmetic here: fewer tokens or sequences');
  }
  return {
    groups: parts, tp: s.tp,
    perTokenBytes: parts.reduce((a, p) => a + p.layers * p.layerTokenBytes, 0) * s.tp,
    sequenceBytes: seqGpu * s.tp, perGpuSequenceBytes: seqGpu,
    fixedBytes: fixedGpu * s.tp, perGpuFixedBytes: fixedGpu,
    perGpuTotalBytes: totalGpu, totalBytes: totalGpu * s.tp,
  };
}

// The one formula, 2 × layers × KV heads × head dim × bytes × T × N, on the config's top-level numbers.
export function naiveBytes(naive, tokens, sequences, kvDtype) {
  return Math.trunc(2 * naive.layers * naive.kv_heads * naive.head_dim * (ELEMENT_BITS[kvDtype] / 8)) * tokens * sequences;
}

// Memory plan on one GPU: weights ÷ TP + fixed scales + N sequences. How many sequences of `tokens` fit
// (null: nothing grows, so any number does), and the longest T up to `maxTokens` for `sequences`.
export function fit(groups, storage, { memory, weights, tokens, sequences, maxTokens }) {
  const s = storageOf(storage);
  const weightsPerGpu = Math.ceil(weights / s.tp);
  const free = memory - weightsPerGpu - cacheBytes(groups, 0, 1, s).perGpuFixedBytes;
  const perSeq = (t) => cacheBytes(groups, t, 1, s).perGpuSequenceBytes;
  const one = perSeq(tokens);
  const fitSequences = one ? Math.max(0, Math.floor(free / one)) : null;
  if (free < 0 || sequences * perSeq(0) > free) return { weightsPerGpu, sequences: 0, tokens: 0 };
  let lo = 0;
  let hi = maxTokens; // perSeq never shrinks as t grows: bisect for the largest t that fits
  while (lo < hi) {
    const mid = Math.floor((lo + hi + 1) / 2);
    if (sequences * perSeq(mid) <= free) lo = mid;
    else hi = mid - 1;
  }
  return { weightsPerGpu, sequences: fitSequences, tokens: lo };
}
