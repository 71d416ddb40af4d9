// KV-cache bytes for a model as layer groups, no DOM: the browser twin of formulas/kv_layers.py, checked
// against the same golden cases (static/data/kv_golden.json `layer_cases`). Groups and storage use the
// Python names (snake_case keys in the data), results are camelCase. Every result is a whole number of
// bytes below 2^53, so double arithmetic is exact; a total beyond that is an error naming `tokens`.

export const ELEMENT_BITS = { fp32: 32, fp16: 16, fp8: 8, fp8_e5m2: 8, int8: 8, int4: 4 };
export const KINDS = ['full', 'sliding', 'chunked', 'mla', 'state', 'shared', 'cross'];
export const SCALES = ['none', 'tensor', 'head', 'group'];
export const CONV_COLUMNS = ['transformers', 'vllm'];
// The --kv-cache-dtype values whose pages this file models: auto (the model's fp32 / bf16 / fp16), fp8 (e4m3) and
// fp8_e5m2. vLLM 0.32.0 has more (vllm/config/cache.py CacheDType: fp8_inc, fp8_ds_mla, nvfp4, int8_per_token_head…).
const VLLM_KV_TYPES = ['fp32', 'fp16', 'fp8', 'fp8_e5m2'];
const VLLM_KV_TYPES_TEXT = "reproduced for vLLM's fp32, bf16 / fp16 (--kv-cache-dtype auto), fp8 and fp8_e5m2 caches; vLLM 0.32.0 has others"
  + ' (fp8_inc, nvfp4, int8_per_token_head, among more) whose pages this calculator does not model';
const ATTENTION = ['full', 'sliding', 'chunked', 'cross']; // a key and a value per KV head per position
const STORAGE_DEFAULTS = {
  kv_dtype: 'fp16', scale: 'none', group_size: 32, scale_bytes: 2, block_size: 1, tp: 1, state_bytes: 2, zero_point: false,
  conv_columns: 'transformers', images: 1,
};
const MAX_EXACT = Number.MAX_SAFE_INTEGER;

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
  for (const [key, lo, hi] of [['group_size', 1, 65536], ['scale_bytes', 1, 8], ['block_size', 1, 4096], ['tp', 1, 1024], ['state_bytes', 1, 8], ['images', 0, 1024]]) {
    whole(s[key], lo, hi, key);
  }
  if (typeof s.zero_point !== 'boolean') throw new KvInputError('zero_point', 'must be true or false');
  if (!CONV_COLUMNS.includes(s.conv_columns)) throw new KvInputError('conv_columns', `must be one of ${CONV_COLUMNS.join(', ')}`);
  return s;
}

function checkGroup(g, i) {
  const at = `groups[${i}]`;
  if (!KINDS.includes(g.kind)) throw new KvInputError(`${at}.kind`, `unknown kind ${JSON.stringify(g.kind)}; known: ${KINDS.join(', ')}`);
  whole(g.layers, 1, 4096, `${at}.layers`);
  if (ATTENTION.includes(g.kind)) {
    whole(g.kv_heads, 1, 4096, `${at}.kv_heads`);
    whole(g.head_dim, 1, 65536, `${at}.head_dim`);
    if ('value_dim' in g) whole(g.value_dim, 1, 65536, `${at}.value_dim`);
  }
  if (g.kind === 'sliding') whole(g.window, 1, 2 ** 30, `${at}.window`);
  if (g.kind === 'chunked') whole(g.chunk, 1, 2 ** 30, `${at}.chunk`);
  if (g.kind === 'cross') whole(g.per_image, 1, 2 ** 30, `${at}.per_image`);
  if (g.kind === 'mla') {
    whole(g.latent, 1, 65536, `${at}.latent`);
    whole(g.rope_dim, 0, 65536, `${at}.rope_dim`);
  }
  if (g.kind === 'state') {
    whole(g.conv, 0, 2 ** 40, `${at}.conv`);
    whole(g.state, 0, 2 ** 40, `${at}.state`);
    if ('conv_kernel' in g) whole(g.conv_kernel, 1, 1024, `${at}.conv_kernel`);
    if ('recurrent_bytes' in g) whole(g.recurrent_bytes, 1, 8, `${at}.recurrent_bytes`);
  }
}

// max(1, heads / TP): heads split over the GPUs, replicated once TP exceeds them.
export function kvHeadsPerGpu(kvHeads, tp) {
  if ((tp <= kvHeads && kvHeads % tp) || (tp > kvHeads && tp % kvHeads)) {
    throw new KvInputError('tp', `${tp} GPUs cannot split ${kvHeads} KV heads evenly (nor replicate them evenly)`);
  }
  return Math.max(1, Math.floor(kvHeads / tp));
}

// vLLM refuses a TP that does not divide the attention heads (vllm/config/model.py
// ModelConfig.verify_with_parallel_config), whatever the KV heads; `heads` null (not given) is not checked.
export function checkAttentionHeads(heads, tp) {
  if (heads != null && heads % tp) {
    throw new KvInputError('tp', `${tp} GPUs cannot split ${heads} attention heads (num_attention_heads) evenly, which vLLM requires`);
  }
}

const vectorBytes = (elements, bits) => Math.ceil((elements * bits) / 8);

// A zero point beside each scale (asymmetric quantisation) doubles the scale bytes.
function scaleBytesPerToken(vectors, width, s) {
  const each = s.scale_bytes * (s.zero_point ? 2 : 1);
  if (s.scale === 'head') return vectors * each;
  if (s.scale === 'group') return vectors * Math.ceil(width / s.group_size) * each;
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
  const value = 'value_dim' in g ? g.value_dim : g.head_dim; // a value narrower than the key: llama.cpp
  return [g.head_dim, value].reduce((a, w) => a + vectorBytes(heads * w, bits) + scaleBytesPerToken(heads, w, s), 0);
}

// Positions a group holds while the T-th is computed: a window keeps W (transformers stores W − 1 between steps
// and appends the new one; vLLM frees whole blocks, so it may hold up to one block more); a cross-attention group
// holds its images' positions, however long the text.
export function positionsHeld(g, tokens, images = 1) {
  if (g.kind === 'cross') return images * g.per_image;
  if (g.kind === 'sliding') return Math.min(tokens, g.window);
  if (g.kind === 'chunked') return Math.min(tokens, g.chunk);
  return g.kind === 'full' || g.kind === 'mla' ? tokens : 0;
}

function fixedScaleBytes(g, s) {
  if (s.scale !== 'tensor' || !(ATTENTION.includes(g.kind) || g.kind === 'mla')) return 0;
  return g.layers * (g.kind === 'mla' ? 1 : 2) * s.scale_bytes * (s.zero_point ? 2 : 1);
}

// Conv + recurrent elements of one state layer: vLLM's conv state keeps conv_kernel − 1 columns.
export function stateElements(g, s) {
  const conv = s.conv_columns === 'vllm' && g.conv_kernel ? (g.conv / g.conv_kernel) * (g.conv_kernel - 1) : g.conv;
  return conv + g.state;
}

// One state layer's bytes per sequence on one GPU; a group's own recurrent_bytes (RecurrentGemma's float32 RG-LRU
// state) overrides the state type for the recurrent part.
export function stateLayerBytes(g, s) {
  if (!('recurrent_bytes' in g)) return Math.ceil(stateElements(g, s) / s.tp) * s.state_bytes;
  const conv = stateElements(g, s) - g.state;
  return Math.ceil(conv / s.tp) * s.state_bytes + Math.ceil(g.state / s.tp) * g.recurrent_bytes;
}

function groupBytes(g, tokens, s) {
  const held = positionsHeld(g, tokens, s.images);
  const allocated = Math.ceil(held / s.block_size) * s.block_size;
  const perLayerToken = layerTokenBytes(g, s);
  const state = g.kind === 'state' ? g.layers * stateLayerBytes(g, s) : 0;
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
    perTokenBytes: parts.filter((p) => p.kind !== 'cross').reduce((a, p) => a + p.layers * p.layerTokenBytes, 0) * s.tp,
    perImageBytes: groups.filter((g) => g.kind === 'cross')
      .reduce((a, g) => a + g.layers * g.per_image * layerTokenBytes(g, s), 0) * s.tp,
    sequenceBytes: seqGpu * s.tp, perGpuSequenceBytes: seqGpu,
    fixedBytes: fixedGpu * s.tp, perGpuFixedBytes: fixedGpu,
    perGpuTotalBytes: totalGpu, totalBytes: totalGpu * s.tp,
  };
}

// The one formula, 2 × layers × KV heads × head dim × bytes × T × N, on the config's top-level numbers.
// For MLA, the uncompressed cache it replaces: layers × heads × (key dim + value dim) × bytes × T × N.
export function naiveBytes(naive, tokens, sequences, kvDtype) {
  if ('key_dim' in naive) {
    const perToken = naive.layers * naive.kv_heads * (naive.key_dim + naive.value_dim);
    return Math.ceil((perToken * ELEMENT_BITS[kvDtype]) / 8) * tokens * sequences;
  }
  return Math.trunc(2 * naive.layers * naive.kv_heads * naive.head_dim * (ELEMENT_BITS[kvDtype] / 8)) * tokens * sequences;
}

// Bytes one more position adds to one sequence past `tokens`, over all GPUs (before block rounding): the layers
// still growing there; a window or chunk already full adds nothing.
export function furtherTokenBytes(groups, tokens, storage) {
  const s = storageOf(storage);
  const grows = groups.filter((g) => positionsHeld(g, tokens + 1) > positionsHeld(g, tokens));
  return grows.reduce((a, g) => a + g.layers * layerTokenBytes(g, s), 0) * s.tp;
}

// Python's "%.2f" of a double: rounded on the double's exact binary value (toFixed does that too), ties half to
// even where toFixed takes the larger. A tie is exact only when the double is a multiple of 1/8 with an odd
// numerator (x × 200 odd needs 25 to divide it), so 1.015, held as 1.01499…, is no tie and prints 1.01.
export function python2f(x) {
  const eighths = x * 8; // exact: a power-of-two scaling
  if (Number.isInteger(eighths) && eighths % 2 === 1) {
    const hundredths = Math.floor(x * 100); // k/8 × 100 = 12.5k is exact below 2^50
    const n = hundredths % 2 === 0 ? hundredths : hundredths + 1;
    return `${Math.floor(n / 100)}.${String(n % 100).padStart(2, '0')}`;
  }
  return x.toFixed(2);
}

// The line vLLM logs at start, "KV cache size: N tokens, Maximum concurrency for L tokens per request: C x", for a
// model whose every layer is full attention or every layer MLA (vllm/v1/core/kv_cache_utils.py: num_blocks =
// space // page_size // layers, page_size = block_size × one position's bytes in one layer; concurrency =
// num_blocks / cdiv(L, block_size); tokens = int(concurrency × L)), on one GPU's KV space.
export function vllmCapacity(groups, storage, spaceBytes, maxModelLen) {
  const s = storageOf(storage);
  if (groups.length !== 1 || !['full', 'mla'].includes(groups[0].kind)) {
    throw new KvInputError('groups', 'reproduced only for models whose every layer is full attention (or MLA)');
  }
  // Any positive --block-size: vLLM 0.32.0's CacheConfig.block_size is Field(gt=0); the attention backend may refuse a
  // size (get_supported_kernel_block_sizes), which is the backend's rule, not the capacity line's.
  if (!VLLM_KV_TYPES.includes(s.kv_dtype)) throw new KvInputError('kv_dtype', VLLM_KV_TYPES_TEXT);
  if (!['none', 'tensor'].includes(s.scale)) throw new KvInputError('scale', "vLLM's fp8 cache keeps its scales per tensor (k_scale, v_scale per layer)");
  const g = groups[0];
  checkGroup(g, 0);
  whole(spaceBytes, 1, MAX_EXACT, 'space_bytes');
  whole(maxModelLen, 1, 2 ** 30, 'max_model_len');
  const page = s.block_size * layerTokenBytes(g, s);
  const blocks = Math.floor(Math.floor(spaceBytes / page) / g.layers);
  const perRequest = Math.ceil(maxModelLen / s.block_size);
  const concurrency = blocks / perRequest;
  return {
    pageBytes: page, blocks, blocksPerRequest: perRequest, tokens: Math.trunc(concurrency * maxModelLen), concurrency,
    concurrencyText: python2f(concurrency),
  };
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
