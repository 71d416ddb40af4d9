// The cost model's JS twin of formulas/cost.py (no DOM): FLOPs of a prefill and of a decode step,
// the bytes a step reads (weights as the route stores them, the KV cache) and decode tokens/s. Both
// reproduce static/data/cost_golden.json (tests/unit/test_cost.py, tests/browser/test_cost_js.py).
// `shape` is cost.py's Shape as the server sends it (facts.cost_shape): route, layers, attention_heads,
// kv_heads, head_dim, hidden_size, vocab_size, bytes_per_element, matmul_params, quantized_params,
// quantized_rows, other_params, tied_embeddings, float_prefill. Bad counts throw an Error naming the
// field and the limit.

export const ROUTES = ['float32', 'bfloat16', 'float16', 'int4', 'int8'];
const FLOAT_ROUTES = ['float32', 'bfloat16', 'float16'];
const INT4_GROUP = 32; // inputs per scale and minimum (the GGUF's Q4_1 block)
const SCALE_BYTES = 2; // bfloat16 scales and minimums
const FLOAT_ROWS = 16; // a call of this many rows or more runs on float32 weights where the route keeps them
const RESCORED = 32; // the quantized head's int8 pass, then this many candidates per row again in float32

function positive(field, value) {
  if (!Number.isInteger(value) || value < 1) throw new Error(`${field} must be a whole number of at least 1, got ${value}`);
}

// A context may be a mean over a run's steps, so a fraction is allowed.
function atLeastZero(field, value) {
  if (typeof value !== 'number' || !(value >= 0)) throw new Error(`${field} must be a number of at least 0, got ${value}`);
}

const isQuantized = (shape) => !FLOAT_ROUTES.includes(shape.route);
const embeddingBytes = (shape) => embeddingParams(shape) * shape.bytes_per_element;

export function embeddingParams(shape) {
  return shape.vocab_size * shape.hidden_size;
}

export function kvBytesPerToken(shape) {
  return 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.bytes_per_element;
}

// Scores and the weighted sum of values: 2 × head dim FLOPs each, per query-key pair, head and layer.
export function attentionFlops(shape, queries, keys) {
  return 4 * shape.layers * shape.attention_heads * shape.head_dim * queries * keys;
}

// 2 × the multiplied weights per position, causal attention (T(T+1)/2 pairs), ONE row of logits.
export function prefillFlops(shape, tokens) {
  positive('tokens', tokens);
  const pairs = (tokens * (tokens + 1)) / 2;
  return 2 * shape.matmul_params * tokens + attentionFlops(shape, 1, pairs) + headFlops(shape, 1);
}

// Logits: 2 × vocab × hidden a row, plus the quantized head's RESCORED float32 candidates (under FLOAT_ROWS rows).
// A call runs on the float32 weights for a prompt's FLOAT_ROWS rows or more; a decode step's rows never do.
const promptRows = (rows, decode) => rows >= FLOAT_ROWS && !decode;

export function headFlops(shape, logitsRows, decode = false) {
  const rescored = isQuantized(shape) && !promptRows(logitsRows, decode) ? RESCORED * shape.hidden_size : 0;
  return 2 * logitsRows * (embeddingParams(shape) + rescored);
}

// One decode token at `context` cached positions: 2 × (layers' weights + head) plus attention.
export function decodeFlops(shape, context) {
  atLeastZero('context', context);
  return 2 * shape.matmul_params + headFlops(shape, 1) + attentionFlops(shape, 1, context + 1);
}

// int4: two weights a byte plus a bfloat16 scale and minimum per 32 inputs; int8: a byte a weight plus a scale per row.
export function quantizedBytes(shape) {
  const q = shape.quantized_params;
  if (shape.route === 'int4') return Math.floor(q / 2) + Math.floor(q / INT4_GROUP) * 2 * SCALE_BYTES;
  if (shape.route === 'int8') return q + shape.quantized_rows * SCALE_BYTES;
  return 0;
}

// The layers for a call of `rows` positions: the kernel's weights as stored, or their float32 copies
// where the route keeps them (float_prefill) for FLOAT_ROWS rows or more.
export function layerBytesRead(shape, rows, decode = false) {
  const floats = (shape.matmul_params - shape.quantized_params + shape.other_params) * shape.bytes_per_element;
  if (shape.float_prefill && promptRows(rows, decode)) return floats + shape.quantized_params * shape.bytes_per_element;
  return floats + quantizedBytes(shape);
}

const headReadsWholeFloat = (shape, logitsRows, decode = false) => !isQuantized(shape) || promptRows(logitsRows, decode);

// The head: its float weights whole, else the int8 pass (a byte a weight, a scale a row) and RESCORED float rows a row.
export function headBytesRead(shape, logitsRows, decode = false) {
  if (headReadsWholeFloat(shape, logitsRows, decode)) return embeddingBytes(shape);
  return embeddingParams(shape) + shape.vocab_size * SCALE_BYTES + logitsRows * RESCORED * shape.hidden_size * shape.bytes_per_element;
}

// Weights one forward pass over `tokens` positions reads, making `logitsRows` rows of logits (one a token
// unless given): each layer once as it runs, the head, and one embedding row per token (the rest of the
// embedding is never touched, unless the head reads it whole as its own weights).
export function weightBytesRead(shape, tokens = 1, logitsRows = tokens, decode = false) {
  positive('tokens', tokens);
  positive('logits_rows', logitsRows);
  const whole = shape.tied_embeddings && headReadsWholeFloat(shape, logitsRows, decode);
  const rows = whole ? 0 : tokens * shape.hidden_size * shape.bytes_per_element;
  return layerBytesRead(shape, tokens, decode) + headBytesRead(shape, logitsRows, decode) + rows;
}

// Bytes the weights occupy: layers as stored (plus float32 copies with float_prefill), the embedding, an
// untied head's own float weights, and on a quantized route the head's int8 copy with its scales.
export function weightBytesHeld(shape) {
  let layers = layerBytesRead(shape, 1);
  if (shape.float_prefill) layers += shape.quantized_params * shape.bytes_per_element;
  let head = shape.tied_embeddings ? 0 : embeddingBytes(shape);
  if (isQuantized(shape)) head += embeddingParams(shape) + shape.vocab_size * SCALE_BYTES;
  return layers + embeddingBytes(shape) + head;
}

export function kvBytesRead(shape, context) {
  atLeastZero('context', context);
  return kvBytesPerToken(shape) * context;
}

// A prefill: the weights once (one embedding row a position, ONE row of logits) and the prompt's keys and values written.
export function prefillBytes(shape, tokens) {
  return weightBytesRead(shape, tokens, 1) + kvBytesPerToken(shape) * tokens;
}

export function decodeStepBytes(shape, batch, context) {
  positive('batch', batch);
  return weightBytesRead(shape, batch, batch, true) + batch * kvBytesRead(shape, context);
}

// The roof above a point of `intensity` FLOP per byte: bandwidth × intensity left of the ridge, the peak right of it.
export function attainableFlopsS(intensity, peakFlopsS, bandwidthBytesS) {
  return Math.min(peakFlopsS, bandwidthBytesS * intensity);
}

// (n − 1) / (t_last − t_first), times in seconds: THE decode tokens/s (1000 / TPOT also counts the
// time after the last token). Null below two tokens or when no time passed.
export function decodeTokensPerS(tokenTimesS) {
  const n = tokenTimesS ? tokenTimesS.length : 0;
  if (n < 2 || !(tokenTimesS[n - 1] > tokenTimesS[0])) return null;
  return (n - 1) / (tokenTimesS[n - 1] - tokenTimesS[0]);
}

// Achieved rates from a computed count and a measured time (null when either is missing).
export function perSecond(count, ms) {
  return Number.isFinite(count) && ms > 0 ? count / (ms / 1000) : null;
}
