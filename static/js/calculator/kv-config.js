// A Hugging Face config.json read into layer groups, no DOM: the browser twin of formulas/kv_config.py,
// checked against static/data/kv_golden.json `config_cases`. Every value used is listed with its key; a key
// the reader cannot interpret is an error naming it; a default is used only where a named config class has
// one, and then it is listed as such. Keys are read by name (cfg[key]) because they are the file's, not ours.

const TYPE_NAMES = {
  full_attention: 'full', attention: 'full', sliding_attention: 'sliding', chunked_attention: 'chunked',
  linear_attention: 'linear', mamba: 'linear',
};
const BIG = 2 ** 30;
const fmt = (n) => n.toLocaleString('en-US');

class Reader {
  constructor(config) {
    const text = config.text_config;
    const nested = text && typeof text === 'object' && !Array.isArray(text);
    this.cfg = nested ? text : config;
    this.prefix = nested ? 'text_config.' : '';
    this.used = [];
    this.errors = [];
  }

  error(key, message) { this.errors.push({ field: this.prefix + key, message }); }

  has(key) { return this.cfg[key] !== undefined && this.cfg[key] !== null; }

  note(name, key, value, def) {
    const u = { name, key: this.prefix + key, value };
    if (def) u.default = def;
    this.used.push(u);
  }

  whole(key, name, lo = 1, hi = BIG, def = null, why = '') {
    const v = this.cfg[key];
    if (v === undefined || v === null) {
      if (why) { this.note(name, key, def, why); return def; }
      this.error(key, `missing: needed for ${name}`);
      return null;
    }
    if (!Number.isInteger(v) || v < lo || v > hi) {
      this.error(key, `must be a whole number from ${fmt(lo)} to ${fmt(hi)} (got ${JSON.stringify(v)})`);
      return null;
    }
    this.note(name, key, v);
    return v;
  }
}

function countText(kinds) {
  return [...new Set(kinds)].map((k) => `${kinds.filter((x) => x === k).length} ${k}`).join(', ');
}

function every(r, layers, n, most, nth, rule) {
  const out = Array.from({ length: layers }, (_, i) => ((i + 1) % n === 0 ? nth : most));
  if (rule) r.note('layer kinds', 'model_type', countText(out), rule);
  return out;
}

function llama4(r, layers) {
  const given = r.cfg['no_rope_layers'];
  if (Array.isArray(given) && given.length) {
    if (given.length !== layers) {
      r.error('no_rope_layers', `has ${given.length} entries for ${layers} layers`);
      return Array(layers).fill('full');
    }
    r.note('RoPE (chunked) layers', 'no_rope_layers', given.filter(Boolean).length);
    return given.map((v) => (v ? 'chunked' : 'full'));
  }
  const n = r.whole('no_rope_layer_interval', 'NoPE interval', 1, BIG, 4, 'transformers Llama4TextConfig default');
  return every(r, layers, n || 4, 'chunked', 'full', 'transformers Llama4TextConfig: every 4th layer NoPE, full');
}

function fromLayerTypes(r, layers) {
  const types = r.cfg.layer_types;
  if (types.length !== layers) {
    r.error('layer_types', `has ${types.length} entries for ${layers} layers (num_hidden_layers)`);
    return null;
  }
  const out = types.map((t, i) => {
    if (!(t in TYPE_NAMES)) r.error(`layer_types[${i}]`, `unknown value ${JSON.stringify(t)}; known: ${Object.keys(TYPE_NAMES).join(', ')}`);
    return TYPE_NAMES[t] || 'full';
  });
  r.note('layer kinds', 'layer_types', countText(out));
  return out;
}

// Each layer's kind before sharing: full, sliding, chunked or linear.
function pattern(r, layers) {
  const kind = String(r.cfg.model_type ?? '');
  if (Array.isArray(r.cfg.layer_types)) return fromLayerTypes(r, layers);
  if (kind === 'gemma2') return every(r, layers, 2, 'sliding', 'full', 'transformers Gemma2Config: every second layer is full');
  if (kind === 'gemma3' || kind === 'gemma3_text') {
    const n = r.whole('sliding_window_pattern', 'sliding pattern', 1, BIG, 6, 'transformers Gemma3TextConfig default');
    return every(r, layers, n || 6, 'sliding', 'full', `transformers Gemma3TextConfig: every ${n}th layer full`);
  }
  if (kind === 'gemma3n_text') return every(r, layers, 5, 'sliding', 'full', 'transformers Gemma3nTextConfig: every fifth layer full');
  if (r.has('attention_chunk_size')) return llama4(r, layers);
  if (r.has('attn_layer_period')) {
    const period = r.whole('attn_layer_period', 'attention layer period');
    const offset = r.whole('attn_layer_offset', 'attention layer offset', 0);
    if (period === null || offset === null) return null;
    return Array.from({ length: layers }, (_, i) => (i % period === offset ? 'full' : 'linear'));
  }
  if (r.has('full_attention_interval')) {
    const n = r.whole('full_attention_interval', 'full-attention interval');
    return n === null ? null : every(r, layers, n, 'linear', 'full', '');
  }
  if (r.has('sliding_window') && r.cfg.use_sliding_window !== false) return Array(layers).fill('sliding');
  if (r.has('sliding_window')) r.note('sliding window off', 'use_sliding_window', false);
  return Array(layers).fill('full');
}

function kvHeadList(r, layers, heads) {
  const v = r.cfg.num_key_value_heads;
  let perLayer;
  if (Array.isArray(v)) {
    if (v.length !== layers || !v.every((x) => Number.isInteger(x) && x >= 1 && x <= BIG)) {
      r.error('num_key_value_heads', `a per-layer list must hold ${layers} whole numbers`);
      return Array(layers).fill(null);
    }
    r.note('KV heads per layer', 'num_key_value_heads', countText(v));
    perLayer = v;
  } else {
    const kv = r.whole('num_key_value_heads', 'KV heads', 1, BIG, heads, 'transformers: equal to num_attention_heads (MHA)');
    perLayer = Array(layers).fill(kv);
  }
  for (const kv of new Set(perLayer)) {
    if (heads && kv && heads % kv) r.error('num_key_value_heads', `${kv} KV heads do not divide ${heads} attention heads (num_attention_heads)`);
  }
  return perLayer;
}

function headDim(r, heads) {
  if (r.has('head_dim')) return r.whole('head_dim', 'head dim', 1, 65536);
  const hidden = r.whole('hidden_size', 'hidden size');
  if (hidden === null || !heads) return null;
  if (hidden % heads) {
    r.error('hidden_size', `${hidden} does not split over ${heads} heads, and head_dim is not given`);
    return null;
  }
  r.note('head dim', 'hidden_size / num_attention_heads', hidden / heads);
  return hidden / heads;
}

// Conv and recurrent elements per linear layer per sequence, as transformers' caches shape them.
function stateSize(r) {
  if (r.has('mamba_d_state')) {
    const inner = (r.whole('mamba_expand', 'Mamba expand') || 0) * (r.whole('hidden_size', 'hidden size') || 0);
    const conv = inner * (r.whole('mamba_d_conv', 'Mamba conv width') || 0);
    return { conv, state: inner * (r.whole('mamba_d_state', 'Mamba state size') || 0) };
  }
  if (r.has('linear_num_value_heads')) {
    const nk = r.whole('linear_num_key_heads', 'linear key heads');
    const dk = r.whole('linear_key_head_dim', 'linear key dim');
    const nv = r.whole('linear_num_value_heads', 'linear value heads');
    const dv = r.whole('linear_value_head_dim', 'linear value dim');
    const kernel = r.whole('linear_conv_kernel_dim', 'linear conv width');
    if ([nk, dk, nv, dv, kernel].includes(null)) return null;
    return { conv: (2 * nk * dk + nv * dv) * kernel, state: nv * dk * dv };
  }
  r.error('layer_types', 'linear-attention layers, but no mamba_* or linear_* keys to size their state');
  return null;
}

function extras(r, kinds, context) {
  const extra = {};
  if (r.has('kv_lora_rank')) extra.mla = { latent: r.whole('kv_lora_rank', 'MLA latent rank'), rope_dim: r.whole('qk_rope_head_dim', 'MLA RoPE dims', 0) };
  if (kinds.includes('sliding')) {
    extra.window = r.whole('sliding_window', 'sliding window');
    if (extra.window && context && extra.window > context) {
      r.error('sliding_window', `window ${fmt(extra.window)} is larger than the context ${fmt(context)} (max_position_embeddings)`);
    }
  }
  if (kinds.includes('chunked')) extra.chunk = r.whole('attention_chunk_size', 'attention chunk');
  if (kinds.includes('linear')) extra.state = stateSize(r);
  return extra;
}

function layerOf(kind, kv, dim, extra) {
  if (kind === 'linear') return extra.state ? { kind: 'state', ...extra.state } : { kind: 'state', conv: 0, state: 0 };
  if (extra.mla) return { kind: 'mla', ...extra.mla };
  const g = { kind, kv_heads: kv, head_dim: dim };
  if (kind === 'sliding') g.window = extra.window;
  if (kind === 'chunked') g.chunk = extra.chunk;
  return g;
}

// Layers with the same parameters become one group, in first-seen order.
function grouped(layers) {
  const groups = new Map();
  for (const g of layers) {
    const key = JSON.stringify(Object.keys(g).sort().map((k) => [k, g[k]]));
    if (!groups.has(key)) groups.set(key, { ...g, layers: 0 });
    groups.get(key).layers += 1;
  }
  return [...groups.values()].map(({ kind, layers: n, ...rest }) => ({ kind, layers: n, ...rest }));
}

function dedupe(used) {
  const seen = new Map();
  for (const u of used) if (!seen.has(`${u.name}\u0000${u.key}`)) seen.set(`${u.name}\u0000${u.key}`, u);
  return [...seen.values()];
}

// {groups, naive, used, errors, contextWindow}: `errors` empty means `groups` is the whole model.
export function readConfig(config) {
  if (!config || typeof config !== 'object' || Array.isArray(config)) {
    return { groups: [], naive: null, used: [], errors: [{ field: 'config', message: 'not a JSON object' }], contextWindow: null };
  }
  const r = new Reader(config);
  const layers = r.whole('num_hidden_layers', 'layers', 1, 4096);
  const heads = r.whole('num_attention_heads', 'attention heads', 1, BIG);
  const context = r.whole('max_position_embeddings', 'context window', 1, BIG, null, 'no context limit');
  if (layers === null) return { groups: [], naive: null, used: r.used, errors: r.errors, contextWindow: context };
  const kv = kvHeadList(r, layers, heads);
  const dim = headDim(r, heads);
  const kinds = pattern(r, layers) || Array(layers).fill('full');
  const extra = extras(r, kinds, context);
  const perLayer = kinds.map((k, i) => layerOf(k, kv[i], dim, extra));
  const shared = r.whole('num_kv_shared_layers', 'KV-shared layers', 0, layers - 1, 0, 'no sharing');
  for (let i = layers - (shared || 0); i < layers; i += 1) perLayer[i] = { kind: 'shared' };
  return {
    groups: grouped(perLayer), naive: { layers, kv_heads: kv[0], head_dim: dim }, used: dedupe(r.used), errors: r.errors,
    contextWindow: context,
  };
}
