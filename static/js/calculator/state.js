// The calculator's state, no DOM: limits, defaults, presets applied to state, and the round trip
// to the query string (?ctx=8192&seq=2&…), which other figures share, so only our keys are touched.

export const LIMITS = {
  ctx: [1, 1048576], seq: [1, 256], layers: [1, 256], heads: [1, 256], kvHeads: [1, 128],
  headDim: [1, 512], mem: [0.01, 65536], params: [0, 5e12], mixLen: [1, 131072], mixCount: [1, 16],
};
export const BLOCK_SIZES = [1, 8, 16, 32, 64, 128, 256];
export const TP_SIZES = [1, 2, 4, 8, 16, 32, 64];
export const SCALE_KINDS = ['none', 'tensor', 'head', 'group'];
export const GROUP_SIZES = [16, 32, 64, 128];
export const SCALE_BYTES = [2, 4];
const CONFIG_TEXT_MAX = 20000; // a pasted config travels in the link; only its relevant keys are kept
export const DEFAULT_MIX = [12, 150, 700, 1200, 3000, 8192];

// URL key for each state field, in the order they are written.
const KEYS = {
  preset: 'preset', layers: 'layers', heads: 'heads', kvHeads: 'kvh', headDim: 'hd', dtype: 'dtype',
  ctx: 'ctx', seq: 'seq', block: 'block', mem: 'mem', params: 'params', wdtype: 'wdtype', mix: 'mix',
  scale: 'scale', groupSize: 'g', scaleBytes: 'sb', round: 'round', tp: 'tp', sdtype: 'sdtype', config: 'cfg',
};

export function fromPreset(state, preset) {
  return {
    ...state, preset: preset.id, layers: preset.layers, heads: preset.attention_heads,
    kvHeads: preset.kv_heads, headDim: preset.head_dim, dtype: preset.dtype, wdtype: preset.wdtype || preset.dtype,
    params: preset.params, config: null,
  };
}

// A bundled config (`cfg:<id>` as the preset) or a pasted one ('pasted', its text in `config`): the layer
// groups come from the config; the number fields show the one-formula reading of it.
export function fromConfig(state, id, read, params, configText = null) {
  const n = read.naive;
  return {
    ...state, preset: id, layers: n.layers, heads: (read.used.find((u) => u.name === 'attention heads') || {}).value ?? null,
    kvHeads: n.kv_heads, headDim: n.head_dim,
    params, config: configText,
  };
}

export function defaults(presets) {
  const base = {
    ctx: 8192, seq: 1, block: 16, mem: 24, mix: DEFAULT_MIX,
    scale: 'none', groupSize: 32, scaleBytes: 2, round: 1, tp: 1, sdtype: 'fp16', config: null,
  };
  return fromPreset(base, presets.find((p) => p.id === 'reference'));
}

// A whole number in [lo, hi] from text, or undefined: the one reading of typed and linked numbers.
export function readInt(text, [lo, hi]) {
  if (!/^\d+$/.test(text ?? '')) return undefined;
  const n = Number(text);
  return n >= lo && n <= hi ? n : undefined;
}

export function readNum(text, [lo, hi]) {
  const n = Number(text);
  return text && Number.isFinite(n) && n >= lo && n <= hi ? n : undefined;
}

export function parseMix(text) {
  const parts = String(text).split(/[\s,]+/).filter(Boolean);
  if (parts.length < LIMITS.mixCount[0] || parts.length > LIMITS.mixCount[1]) return undefined;
  const lengths = parts.map((p) => readInt(p, LIMITS.mixLen));
  return lengths.includes(undefined) ? undefined : lengths;
}

// State from URLSearchParams: a known preset first, then every valid explicit value over it.
// Invalid or missing values keep the default, so a mangled link still opens a working calculator.
export function parse(search, presets, elementIds, catalogueIds = []) {
  let state = defaults(presets);
  const named = search.get(KEYS.preset) ?? '';
  const preset = presets.find((p) => p.id === named);
  if (preset) state = fromPreset(state, preset);
  else if (['live', 'custom'].includes(named)) state.preset = named;
  else if (catalogueIds.includes(named.replace(/^cfg:/, '')) && named.startsWith('cfg:')) state.preset = named;
  else if (named === 'pasted' && (search.get(KEYS.config) || '').length <= CONFIG_TEXT_MAX) {
    state.preset = 'pasted';
    state.config = search.get(KEYS.config);
  }
  for (const [field, allowed] of [['scale', SCALE_KINDS], ['groupSize', GROUP_SIZES], ['scaleBytes', SCALE_BYTES],
    ['round', BLOCK_SIZES], ['tp', TP_SIZES]]) {
    const raw = search.get(KEYS[field]);
    const v = field === 'scale' ? raw : Number(raw);
    if (raw !== null && allowed.includes(v)) state[field] = v;
  }
  if (elementIds.includes(search.get(KEYS.sdtype))) state.sdtype = search.get(KEYS.sdtype);

  for (const field of ['layers', 'kvHeads', 'headDim', 'ctx', 'seq', 'params']) {
    const v = readInt(search.get(KEYS[field]), LIMITS[field]);
    if (v !== undefined) state[field] = v;
  }
  const heads = search.get(KEYS.heads);
  if (heads === '') state.heads = null;
  else if (readInt(heads, LIMITS.heads) !== undefined) state.heads = Number(heads);
  if (search.get(KEYS.params) === '') state.params = null;
  for (const field of ['dtype', 'wdtype']) {
    if (elementIds.includes(search.get(KEYS[field]))) state[field] = search.get(KEYS[field]);
  }
  const block = Number(search.get(KEYS.block));
  if (BLOCK_SIZES.includes(block)) state.block = block;
  const mem = readNum(search.get(KEYS.mem), LIMITS.mem);
  if (mem !== undefined) state.mem = mem;
  const mix = parseMix(search.get(KEYS.mix) ?? '');
  if (mix) state.mix = mix;
  return state;
}

// Writes our keys into `search` (a URLSearchParams), leaving other figures' keys alone.
export function write(search, state) {
  for (const [field, key] of Object.entries(KEYS)) {
    const v = state[field];
    search.set(key, v == null ? '' : Array.isArray(v) ? v.join(',') : String(v));
  }
  return search;
}
