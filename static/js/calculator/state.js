// The calculator's state, no DOM: limits, defaults, presets applied to state, the one reading of typed and linked
// numbers, and the round trip to the query string (?ctx=8192&seq=2&…), which other figures share, so only our keys
// are touched. parse() is the one validator of a link: what it refuses keeps the default and is named in
// `problems` (the URL key, the limit), so a mangled link still opens a working calculator that says what it set aside.

export const LIMITS = {
  ctx: [1, 10485760], seq: [1, 256], layers: [1, 256], heads: [1, 256], kvHeads: [1, 128],
  headDim: [1, 512], mem: [0.01, 65536], params: [0, 5e12], mixLen: [1, 10485760], mixCount: [1, 16],
  vspace: [0.001, 65536], vlen: [1, 10485760], images: [0, 64],
};
// Positions a paged block holds (1 = no rounding): vLLM's --block-size choices (vllm/config/cache.py BlockSize).
export const BLOCK_SIZES = [1, 8, 16, 32, 64, 128, 256];
export const TP_SIZES = [1, 2, 4, 8, 16, 32, 64];
export const SCALE_KINDS = ['none', 'tensor', 'head', 'group'];
export const GROUP_SIZES = [16, 32, 64, 128];
export const SCALE_BYTES = [2, 4];
export const CONV_COLUMNS = ['transformers', 'vllm'];
export const CONFIG_TEXT_MAX = 20000; // a pasted config travels in the link; only its relevant keys are kept
export const DEFAULT_MIX = [12, 150, 700, 1200, 3000, 8192];

// What each field is called on the page, for messages that name it.
export const LABELS = {
  ctx: 'Context length', seq: 'Simultaneous sequences', layers: 'Layers', heads: 'Attention heads', kvHeads: 'KV heads',
  headDim: 'Head dim', mem: 'Memory per GPU (GiB)', params: 'Parameters (billions)', mix: 'Request lengths',
  vspace: 'KV cache space (GiB)', vlen: 'Max model length', tp: 'Tensor parallel', block: 'Block size',
  dtype: 'Cache element type', wdtype: 'Weights element type', sdtype: 'State element type', scale: 'Scales',
  groupSize: 'Group size', scaleBytes: 'Scale size', zp: 'Zero points', conv: 'Conv state', preset: 'Preset', config: 'Pasted config',
  images: 'Images per request',
};

// URL key for each state field, in the order they are written.
const KEYS = {
  preset: 'preset', layers: 'layers', heads: 'heads', kvHeads: 'kvh', headDim: 'hd', dtype: 'dtype',
  ctx: 'ctx', seq: 'seq', block: 'block', mem: 'mem', params: 'params', wdtype: 'wdtype', mix: 'mix',
  scale: 'scale', groupSize: 'g', scaleBytes: 'sb', zp: 'zp', tp: 'tp', sdtype: 'sdtype', conv: 'conv',
  vspace: 'vspace', vlen: 'vlen', images: 'img', config: 'cfg',
};
export const urlKey = (field) => KEYS[field] || field;

export function fromPreset(state, preset) {
  return {
    ...state, preset: preset.id, layers: preset.layers, heads: preset.attention_heads,
    kvHeads: preset.kv_heads, headDim: preset.head_dim, dtype: preset.dtype, wdtype: preset.wdtype || preset.dtype,
    params: preset.params, config: null,
  };
}

// A bundled config (`cfg:<id>` as the preset) or a pasted one ('pasted', its text in `config`): the layer groups
// come from the config; the number fields show the one-formula reading of it; the weights' and the state's
// element types come from the file when it states them (an fp8 quantization block, torch_dtype, mamba_ssm_dtype).
export function fromConfig(state, id, read, params, configText = null) {
  const n = read.naive || { layers: null, kv_heads: null, head_dim: null };
  const heads = (read.used.find((u) => u.name === 'attention heads') || {}).value ?? null;
  return {
    ...state, preset: id, layers: n.layers, heads, kvHeads: n.kv_heads ?? null, headDim: n.head_dim ?? null,
    wdtype: read.weights ? read.weights.dtype : state.wdtype, sdtype: read.stateDtype || state.sdtype,
    params, config: configText,
  };
}

export function defaults(presets) {
  const base = {
    ctx: 8192, seq: 1, block: 16, mem: 24, mix: DEFAULT_MIX, scale: 'none', groupSize: 32, scaleBytes: 2, zp: false,
    tp: 1, sdtype: 'fp16', conv: 'transformers', vspace: 1, vlen: 2048, images: 1, config: null,
  };
  return fromPreset(base, presets.find((p) => p.id === 'reference'));
}

const fmt = (n) => n.toLocaleString('en-US');

// A whole number in [lo, hi] from text: {value} or {reason}. Plain digits and exponent forms that are whole
// (1e3) are read; anything else is refused with the limit, never cut to a prefix.
export function readWhole(text, [lo, hi]) {
  const t = String(text ?? '').trim().replaceAll(',', '');
  const n = /^[0-9]+(\.[0-9]*)?([eE][+]?[0-9]+)?$/.test(t) ? Number(t) : NaN;
  if (!Number.isInteger(n) || n < lo || n > hi) {
    return { reason: `must be a whole number from ${fmt(lo)} to ${fmt(hi)} (got ${JSON.stringify(t.slice(0, 24))})` };
  }
  return { value: n };
}

export function readNumber(text, [lo, hi]) {
  const t = String(text ?? '').trim().replaceAll(',', '');
  const n = /^[0-9]*\.?[0-9]+([eE][+-]?[0-9]+)?$|^[0-9]+\.$/.test(t) ? Number(t) : NaN;
  if (!Number.isFinite(n) || n < lo || n > hi) {
    return { reason: `must be a number from ${fmt(lo)} to ${fmt(hi)} (got ${JSON.stringify(t.slice(0, 24))})` };
  }
  return { value: n };
}

// The old readers (a value or undefined), kept for callers that only need yes or no.
export const readInt = (text, range) => readWhole(text, range).value;
export const readNum = (text, range) => readNumber(text, range).value;

export function parseMix(text) {
  const parts = String(text ?? '').split(/[\s,]+/).filter(Boolean);
  if (parts.length < LIMITS.mixCount[0] || parts.length > LIMITS.mixCount[1]) return undefined;
  const lengths = parts.map((p) => readInt(p, LIMITS.mixLen));
  return lengths.includes(undefined) ? undefined : lengths;
}

function choice(value, allowed) {
  return allowed.includes(value) ? { value } : { reason: `must be one of ${allowed.join(', ')}` };
}

// Each linked field: how its text is read (the same readers as the typed fields).
function fieldReaders(elementIds) {
  const numberOf = (allowed) => (t) => choice(Number(t), allowed);
  return {
    ctx: (t) => readWhole(t, LIMITS.ctx), seq: (t) => readWhole(t, LIMITS.seq), layers: (t) => readWhole(t, LIMITS.layers),
    kvHeads: (t) => readWhole(t, LIMITS.kvHeads), headDim: (t) => readWhole(t, LIMITS.headDim),
    heads: (t) => (t === '' ? { value: null } : readWhole(t, LIMITS.heads)),
    params: (t) => (t === '' ? { value: null } : readWhole(t, LIMITS.params)),
    mem: (t) => readNumber(t, LIMITS.mem), vspace: (t) => readNumber(t, LIMITS.vspace), vlen: (t) => readWhole(t, LIMITS.vlen),
    images: (t) => readWhole(t, LIMITS.images),
    block: numberOf(BLOCK_SIZES), tp: numberOf(TP_SIZES), groupSize: numberOf(GROUP_SIZES), scaleBytes: numberOf(SCALE_BYTES),
    scale: (t) => choice(t, SCALE_KINDS), conv: (t) => choice(t, CONV_COLUMNS),
    zp: (t) => choice(t, ['0', '1', 'false', 'true']).reason ? { reason: 'must be 0 or 1' } : { value: t === '1' || t === 'true' },
    dtype: (t) => choice(t, elementIds), wdtype: (t) => choice(t, elementIds), sdtype: (t) => choice(t, elementIds),
    mix: (t) => {
      const v = parseMix(t);
      return v ? { value: v } : { reason: `must be 1 to ${LIMITS.mixCount[1]} whole numbers from 1 to ${fmt(LIMITS.mixLen[1])}` };
    },
  };
}

function presetFrom(search, presets, catalogueIds, problems) {
  const named = search.get(KEYS.preset);
  if (named === null) return null;
  const preset = presets.find((p) => p.id === named);
  if (preset) return { preset };
  if (['live', 'custom'].includes(named)) return { id: named };
  if (named.startsWith('cfg:') && catalogueIds.includes(named.slice(4))) return { id: named };
  if (named === 'pasted') {
    const text = search.get(KEYS.config) || '';
    if (text && text.length <= CONFIG_TEXT_MAX) return { id: 'pasted', config: text };
    problems.push({ field: 'cfg', message: text ? `longer than the ${fmt(CONFIG_TEXT_MAX)} characters a link carries` : 'missing: a pasted preset needs its config' });
    return null;
  }
  problems.push({ field: 'preset', message: `${JSON.stringify(named.slice(0, 40))} is not a preset here` });
  return null;
}

// {state, problems}: a known preset first, then every valid explicit value over it. A value that does not read
// keeps the default and is listed in `problems` as {field: its URL key, message: the limit}.
export function parse(search, presets, elementIds, catalogueIds = []) {
  const problems = [];
  let state = defaults(presets);
  const chosen = presetFrom(search, presets, catalogueIds, problems);
  if (chosen && chosen.preset) state = fromPreset(state, chosen.preset);
  else if (chosen) state = { ...state, preset: chosen.id, config: chosen.config ?? null };
  if (search.get('round') !== null && search.get(KEYS.block) === null) search = new URLSearchParams([...search, [KEYS.block, search.get('round')]]);
  for (const [field, read] of Object.entries(fieldReaders(elementIds))) {
    const raw = search.get(KEYS[field]);
    // A config preset writes no one-formula head numbers when it has none (MLA): nothing to read.
    if (raw === null || (raw === '' && ['layers', 'kvHeads', 'headDim'].includes(field))) continue;
    const got = read(raw);
    if ('value' in got) state[field] = got.value;
    else problems.push({ field: KEYS[field], message: got.reason });
  }
  return { state, problems };
}

// Writes our keys into `search` (a URLSearchParams), leaving other figures' keys alone.
export function write(search, state) {
  search.delete('round'); // the old name of the block size
  for (const [field, key] of Object.entries(KEYS)) {
    const v = state[field];
    if (field === 'zp') search.set(key, v ? '1' : '0');
    else search.set(key, v == null ? '' : Array.isArray(v) ? v.join(',') : String(v));
  }
  return search;
}
