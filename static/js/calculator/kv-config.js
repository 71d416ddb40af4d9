// A Hugging Face config.json read into layer groups, no DOM: the browser twin of formulas/kv_config.py. Key names
// come from the one alias table, static/data/config-keys.json (passed in as `table`); both twins are checked
// against the corpus of real files in tests/data/configs/. Every value used is listed with its key; a key the
// reader cannot interpret is an error naming it; a key read outside its known families is flagged; a key that
// changes the cache in a way this calculator does not model refuses the file. The file's keys are read as own
// properties only, so names like "constructor" or "__proto__" are plain unknown keys, never Object's.

const TYPE_NAMES = new Map([
  ['full_attention', 'full'], ['attention', 'full'], ['sliding_attention', 'sliding'], ['chunked_attention', 'chunked'],
  ['linear_attention', 'linear'], ['mamba', 'linear'],
]);
const BIG = 2 ** 30;
const QWEN_WINDOWED = ['qwen2', 'qwen3', 'qwen3_moe', 'qwen3_vl_text'];
const WEIGHT_TYPES = new Map([['bfloat16', 'fp16'], ['float16', 'fp16'], ['float32', 'fp32']]);
const STATE_TYPES = new Map([['float32', 'fp32'], ['bfloat16', 'fp16'], ['float16', 'fp16']]);
const fmt = (n) => n.toLocaleString('en-US');

export const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// The value of an own property, or undefined: never one inherited from Object.prototype.
export function own(obj, key) {
  return isObject(obj) && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : undefined;
}

function familiesText(families) {
  return families === '*' ? 'every family' : families.join(', ');
}

class Reader {
  constructor(config, table) {
    const text = own(config, 'text_config');
    this.table = table;
    this.top = config;
    this.cfg = isObject(text) ? text : config;
    this.prefix = isObject(text) ? 'text_config.' : '';
    this.family = String(own(this.cfg, 'model_type') || own(config, 'model_type') || '');
    this.used = [];
    this.errors = [];
    this.flags = [];
  }

  error(key, message) { this.errors.push({ field: this.prefix + key, message }); }

  flag(key, message) { this.flags.push({ field: this.prefix + key, message }); }

  // The file's value at `key` ("a.b" reads inside an object), null when absent or null.
  get(key) {
    let node = this.cfg;
    for (const part of key.split('.')) {
      node = own(node, part);
      if (node === undefined) return null;
    }
    return node;
  }

  has(key) { return this.get(key) !== null; }

  note(name, key, value, def = '') {
    const u = { name, key: this.prefix + key, value };
    if (def) u.default = def;
    this.used.push(u);
  }

  check(key, v, lo, hi) {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) {
      this.error(key, `must be a whole number from ${fmt(lo)} to ${fmt(hi)} (got ${JSON.stringify(v)})`);
      return null;
    }
    return v;
  }

  // An integer read from `key` and recorded as used; a missing key takes `def` only when `why` says whose.
  whole(key, name, lo = 1, hi = BIG, def = null, why = '') {
    const v = this.get(key);
    if (v === null) {
      if (why) { this.note(name, key, def, why); return def; }
      this.error(key, `missing: needed for ${name}`);
      return null;
    }
    const n = this.check(key, v, lo, hi);
    if (n !== null) this.note(name, key, n);
    return n;
  }

  knownForFamily(key, families) {
    if (families !== '*' && this.family && !families.includes(this.family)) {
      this.flag(key, `read, though this calculator knows ${key} only in ${familiesText(families)} configs`);
    }
  }

  // One fact from the first alias the file sets (config-keys.json order); aliases that disagree are an error,
  // an alias outside its families is flagged, a missing fact takes the family's transformers default.
  fact(fact, lo = 1, hi = BIG, def = null, why = '', skip = []) {
    const spec = this.table.facts[fact];
    const present = spec.aliases.filter((a) => !skip.includes(a.key) && this.has(a.key));
    if (!present.length) {
      const familyDefault = own(this.table.defaults, this.family) || {};
      const standard = spec.standard;
      if (own(familyDefault, standard) !== undefined) {
        this.note(spec.name, standard, familyDefault[standard], familyDefault.source);
        return familyDefault[standard];
      }
      if (why) { this.note(spec.name, standard, def, why); return def; }
      this.error(standard, `missing: needed for ${spec.name} (looked for ${spec.aliases.map((a) => a.key).join(' / ')})`);
      return null;
    }
    const values = present.map((a) => [a.key, this.get(a.key)]);
    if (new Set(values.map(([, v]) => JSON.stringify(v))).size > 1) {
      const said = values.map(([k, v]) => `${k} = ${JSON.stringify(v)}`).join(' and ');
      this.error(present[0].key, `${said} disagree about the ${spec.name}`);
      return null;
    }
    this.knownForFamily(present[0].key, present[0].families);
    return this.whole(present[0].key, spec.name, lo, hi);
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

function fromLayerTypes(r, layers) {
  const types = r.get('layer_types');
  if (!Array.isArray(types)) {
    const kind = typeof types === 'string' ? 'str' : typeof types;
    r.error('layer_types', `must be a list of ${layers} layer kinds (got ${kind})`);
    return null;
  }
  if (types.length !== layers) {
    r.error('layer_types', `has ${types.length} entries for ${layers} layers (num_hidden_layers)`);
    return null;
  }
  const out = types.map((t, i) => {
    const known = typeof t === 'string' && TYPE_NAMES.has(t);
    if (!known) r.error(`layer_types[${i}]`, `unknown value ${JSON.stringify(t)}; known: ${[...TYPE_NAMES.keys()].join(', ')}`);
    return known ? TYPE_NAMES.get(t) : 'full';
  });
  r.note('layer kinds', 'layer_types', countText(out));
  return out;
}

function llama4(r, layers) {
  const given = r.get('no_rope_layers');
  if (Array.isArray(given) && given.length) {
    if (given.length !== layers) {
      r.error('no_rope_layers', `has ${given.length} entries for ${layers} layers`);
      return Array(layers).fill('full');
    }
    r.note('RoPE (chunked) layers', 'no_rope_layers', given.filter(Boolean).length);
    return given.map((v) => (v ? 'chunked' : 'full'));
  }
  const n = r.whole('no_rope_layer_interval', 'NoPE interval', 1, BIG, 4, 'transformers Llama4TextConfig default');
  return every(r, layers, n || 4, 'chunked', 'full', `transformers Llama4TextConfig: every ${n || 4}th layer NoPE, full`);
}

function gemma3(r, layers, def, rule) {
  if (!r.family) r.flag('sliding_window_pattern', "no model_type: read as transformers' Gemma 3 reads it (every n-th layer full)");
  const n = r.whole('sliding_window_pattern', 'sliding pattern', 1, BIG, def, `${rule} default`);
  return every(r, layers, n || def, 'sliding', 'full', `${rule}: every ${n || def}th layer full`);
}

// transformers Qwen2Config / Qwen3Config: the window applies only with use_sliding_window, and then from layer
// max_window_layers on (Qwen2-MoE: odd layers below it).
function qwenWindows(r, layers) {
  if (r.get('use_sliding_window') !== true) {
    if (r.has('sliding_window')) {
      const why = r.get('use_sliding_window') === false ? '' : 'transformers Qwen2Config default: False';
      r.note('sliding window off', 'use_sliding_window', false, why);
    }
    return Array(layers).fill('full');
  }
  const start = r.whole('max_window_layers', 'first sliding layer', 0, layers, 28, 'transformers Qwen2Config default');
  if (r.family === 'qwen2_moe') return Array.from({ length: layers }, (_, i) => (i % 2 === 0 && i < start ? 'sliding' : 'full'));
  return Array.from({ length: layers }, (_, i) => (i >= start ? 'sliding' : 'full'));
}

// Each layer's kind before sharing: full, sliding, chunked or linear.
function pattern(r, layers) {
  const kind = r.family;
  if (r.get('layer_types') !== null) return fromLayerTypes(r, layers);
  if (kind === 'gemma2') return every(r, layers, 2, 'sliding', 'full', 'transformers Gemma2Config: every second layer is full');
  if (kind === 'gemma3' || kind === 'gemma3_text' || (r.has('sliding_window_pattern') && kind !== 'cohere2')) {
    return gemma3(r, layers, 6, 'transformers Gemma3TextConfig');
  }
  if (kind === 'cohere2') return gemma3(r, layers, 4, 'transformers Cohere2Config');
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
  if (kind === 'mamba' || kind === 'falcon_mamba') {
    r.note('layer kinds', 'model_type', `${layers} linear`, `transformers ${kind}: every layer a Mamba mixer`);
    return Array(layers).fill('linear');
  }
  if ([...QWEN_WINDOWED, 'qwen2_moe'].includes(kind)) return qwenWindows(r, layers);
  if (r.has('sliding_window') && r.get('use_sliding_window') !== false) return Array(layers).fill('sliding');
  if (r.has('sliding_window')) r.note('sliding window off', 'use_sliding_window', false);
  return Array(layers).fill('full');
}

function kvHeadList(r, layers, heads) {
  const mq = r.table.multi_query;
  const newFalcon = mq.falcon_types.includes(r.family) && r.get('new_decoder_architecture') === true;
  if (r.get('multi_query') === true && !newFalcon) {
    r.knownForFamily('multi_query', mq.families);
    r.note('KV heads (true: one, as vLLM and transformers read it)', 'multi_query', 1);
    return Array(layers).fill(1);
  }
  const v = r.get('num_key_value_heads');
  let perLayer;
  if (Array.isArray(v)) {
    if (v.length !== layers || !v.every((x) => Number.isInteger(x) && x >= 1 && x <= BIG)) {
      r.error('num_key_value_heads', `a per-layer list must hold ${layers} whole numbers`);
      return Array(layers).fill(null);
    }
    r.note('KV heads per layer', 'num_key_value_heads', countText(v));
    perLayer = v;
  } else {
    const skip = r.get('multi_query_attention') === false ? ['multi_query_group_num'] : [];
    const kv = r.fact('kv_heads', 1, BIG, heads, 'equal to the attention heads (MHA), as transformers and vLLM assume', skip);
    if (kv === null && !r.errors.length) r.error('num_key_value_heads', 'missing, and no num_attention_heads to take it from');
    perLayer = Array(layers).fill(kv);
  }
  for (const kv of new Set(perLayer)) {
    if (heads && kv && heads % kv) r.error('num_key_value_heads', `${kv} KV heads do not divide ${heads} attention heads`);
  }
  return perLayer;
}

function headDim(r, heads) {
  if (r.table.facts.head_dim.aliases.some((a) => r.has(a.key))) return r.fact('head_dim', 1, 65536);
  const hidden = r.fact('hidden_size');
  if (hidden === null || !heads) return null;
  if (hidden % heads) {
    r.error('hidden_size', `${hidden} does not split over ${heads} heads, and head_dim is not given`);
    return null;
  }
  r.note('head dim', 'hidden_size / num_attention_heads', hidden / heads);
  return hidden / heads;
}

function mambaState(r) {
  const expand = r.fact('mamba_expand');
  const conv = r.fact('mamba_conv');
  const size = r.fact('mamba_state');
  const hidden = r.fact('hidden_size');
  if ([expand, conv, size, hidden].includes(null)) return null;
  const inner = expand * hidden;
  return { conv: inner * conv, state: inner * size, conv_kernel: conv };
}

// Conv and recurrent elements per linear layer per sequence, as transformers' caches shape them (conv_kernel
// columns there; vLLM keeps conv_kernel − 1, and kv-layers.js applies the choice).
function stateSize(r) {
  if (r.table.facts.mamba_state.aliases.some((a) => r.has(a.key))) return mambaState(r);
  if (r.has('linear_num_value_heads')) {
    const nk = r.whole('linear_num_key_heads', 'linear key heads');
    const dk = r.whole('linear_key_head_dim', 'linear key dim');
    const nv = r.whole('linear_num_value_heads', 'linear value heads');
    const dv = r.whole('linear_value_head_dim', 'linear value dim');
    const kernel = r.whole('linear_conv_kernel_dim', 'linear conv width');
    if ([nk, dk, nv, dv, kernel].includes(null)) return null;
    return { conv: (2 * nk * dk + nv * dv) * kernel, state: nv * dk * dv, conv_kernel: kernel };
  }
  r.error('layer_types', 'linear-attention layers, but no mamba_* / state_size or linear_* keys to size their state');
  return null;
}

function mla(r) {
  const latent = r.whole('kv_lora_rank', 'MLA latent rank', 1, 65536);
  const rope = r.whole('qk_rope_head_dim', 'MLA RoPE dims', 0, 65536);
  return latent === null || rope === null ? null : { latent, rope_dim: rope };
}

function extras(r, kinds, context) {
  const extra = {};
  if (r.has('kv_lora_rank')) extra.mla = mla(r);
  if (kinds.includes('sliding')) {
    extra.window = r.whole('sliding_window', 'sliding window');
    if (extra.window && context && extra.window >= context) {
      r.flag('sliding_window', `window ${fmt(extra.window)} ≥ the context ${fmt(context)}: it never binds there`);
    }
  }
  if (kinds.includes('chunked')) extra.chunk = r.whole('attention_chunk_size', 'attention chunk');
  if (kinds.includes('linear')) extra.state = stateSize(r);
  return extra;
}

function layerOf(kind, kv, dim, extra) {
  if (kind === 'linear') return { kind: 'state', ...(extra.state || { conv: 0, state: 0 }) };
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

// Keys that change the cache in a way this calculator does not model: the file is refused, the key named.
function refuseUnread(r) {
  for (const entry of r.table.unread) {
    const v = r.get(entry.key);
    if (v === null || v === false || v === 0) continue;
    r.error(entry.key, `${entry.why}, so this calculator refuses the file rather than count it wrong`);
  }
}

function flagOutsideFamilies(r) {
  if (!r.family) r.flag('model_type', 'not given: keys are read by their names alone');
  for (const [key, spec] of Object.entries(r.table.known)) {
    if (key !== 'layer_types' && r.has(key)) r.knownForFamily(key, spec.families);
  }
}

// The weights' element type as the file states it: an fp8 quantization block, else torch_dtype / dtype.
function weightsOf(r) {
  for (const where of [r.top, r.cfg]) {
    const q = own(where, 'quantization_config');
    const method = own(q, 'quant_method');
    if (method === undefined || method === null) continue;
    const dtype = own(r.table.weights.quant_method, String(method));
    if (dtype) {
      const block = own(q, 'weight_block_size');
      let note = `fp8 ${own(q, 'fmt') ?? ''} weights`.trim();
      if (Array.isArray(block)) note += `, one scale per ${block.join(' × ')} block (not counted)`;
      return { dtype, key: 'quantization_config.quant_method', value: String(method), note };
    }
    r.flag('quantization_config.quant_method', `weights quantised as ${String(method)}: not applied, set the type`);
    return null;
  }
  for (const [where, prefix] of [[r.cfg, r.prefix], [r.top, '']]) {
    for (const key of ['torch_dtype', 'dtype']) {
      const v = own(where, key);
      if (typeof v === 'string' && WEIGHT_TYPES.has(v)) return { dtype: WEIGHT_TYPES.get(v), key: prefix + key, value: v, note: `${v} weights` };
    }
  }
  return null;
}

// The one formula's numbers; for MLA the cache it compresses: every head's key (nope + RoPE) and value.
function naiveOf(r, layers, kv, heads, dim) {
  if (!r.has('kv_lora_rank')) return { layers, kv_heads: kv, head_dim: dim };
  const [nope, rope, value] = ['qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim'].map((k) => r.get(k));
  if (![nope, rope, value].every(Number.isInteger) || !heads) return null;
  return { layers, kv_heads: heads, key_dim: nope + rope, value_dim: value };
}

function refused(message) {
  return {
    groups: [], naive: null, used: [], errors: [{ field: 'config', message }], flags: [], contextWindow: null,
    weights: null, stateDtype: null, modelType: '',
  };
}

// {groups, naive, used, errors, flags, contextWindow, weights, stateDtype, modelType}: `errors` empty means
// `groups` is the whole model; `flags` are keys read outside the families the table knows them in.
// vLLM applies mamba_ssm_dtype to the recurrent state only, the conv state keeping the model's type
// (vllm/model_executor/layers/mamba/mamba_utils.py _mamba_state_dtype); this calculator has one state type.
const STATE_DTYPE_NOTE = 'state element type (here the whole state; vLLM: the recurrent state only)';
// transformers Gemma3nTextConfig.num_kv_shared_layers: the default a gemma3n_text file leaving the key out takes.
const GEMMA3N_SHARED_DEFAULT = 15;

// The last layers that reuse another's cache: num_kv_shared_layers, else Gemma3nTextConfig's default 15 for a
// gemma3n_text file, else none.
function sharedLayers(r, layers) {
  if (r.family !== 'gemma3n_text' || r.has('num_kv_shared_layers')) {
    return r.whole('num_kv_shared_layers', 'KV-shared layers', 0, layers - 1, 0, 'no sharing');
  }
  if (GEMMA3N_SHARED_DEFAULT > layers - 1) {
    r.error('num_kv_shared_layers', `missing, and Gemma3nTextConfig's default of 15 shared layers needs more than ${layers} layers`);
    return 0;
  }
  return r.whole('num_kv_shared_layers', 'KV-shared layers', 0, layers - 1, GEMMA3N_SHARED_DEFAULT, 'transformers Gemma3nTextConfig default');
}

export function readConfig(config, table) {
  if (!isObject(config)) return refused('not a JSON object');
  const text = own(config, 'text_config');
  if (text !== undefined && text !== null && !isObject(text)) return refused('text_config must be an object');
  const r = new Reader(config, table);
  refuseUnread(r);
  flagOutsideFamilies(r);
  const layers = r.fact('layers', 1, 4096);
  const heads = r.fact('attention_heads', 1, BIG, null, 'not given: only the KV heads matter');
  const context = r.fact('context', 1, BIG, null, 'no context limit');
  const weights = weightsOf(r);
  const stateDtype = STATE_TYPES.get(String(r.get('mamba_ssm_dtype'))) || null;
  if (stateDtype) r.note(STATE_DTYPE_NOTE, 'mamba_ssm_dtype', r.get('mamba_ssm_dtype'));
  const base = { flags: r.flags, contextWindow: context, weights, stateDtype };
  if (layers === null) return { groups: [], naive: null, used: r.used, errors: r.errors, modelType: r.family, ...base };
  const kinds = pattern(r, layers) || Array(layers).fill('full');
  const needsHeads = kinds.some((k) => k !== 'linear') && !r.has('kv_lora_rank');
  const kv = needsHeads ? kvHeadList(r, layers, heads) : Array(layers).fill(null);
  const dim = needsHeads ? headDim(r, heads) : null;
  const extra = extras(r, kinds, context);
  const perLayer = kinds.map((k, i) => layerOf(k, kv[i], dim, extra));
  const shared = sharedLayers(r, layers);
  for (let i = layers - (shared || 0); i < layers; i += 1) perLayer[i] = { kind: 'shared' };
  const seen = new Map();
  for (const u of r.used) if (!seen.has(`${u.name}\u0000${u.key}`)) seen.set(`${u.name}\u0000${u.key}`, u);
  return {
    groups: grouped(perLayer), naive: naiveOf(r, layers, kv[0], heads, dim), used: [...seen.values()], errors: r.errors,
    modelType: r.family, ...base,
  };
}
