// A Hugging Face config.json read into layer groups, no DOM: the browser twin of formulas/kv_config.py. Key names
// come from the one alias table, static/data/config-keys.json (passed in as `table`); both twins are checked
// against the corpus of real files in tests/data/configs/ and one shared hostile corpus. Every value used is listed
// with its key; a key the reader cannot interpret is an error naming it; a key read outside its known families is
// flagged; a key that changes the cache in a way this calculator does not model refuses the file. Where engines
// cache different things for one file, `engines` gives each engine's groups and the source it follows.

import { layerKinds, countText, tokensPerImage } from './kv-patterns.js';
import { BIG, Reader, fmt, isObject, own, shown } from './kv-reader.js';
import { stateKeys, stateSize } from './kv-state.js';

export { isObject, own };

const WEIGHT_TYPES = new Map([['bfloat16', 'fp16'], ['float16', 'fp16'], ['float32', 'fp32']]);
const STATE_TYPES = new Map([['float32', 'fp32'], ['bfloat16', 'fp16'], ['float16', 'fp16']]);
// vLLM applies mamba_ssm_dtype to the recurrent state only, the conv state keeping the model's type
// (vllm/model_executor/layers/mamba/mamba_utils.py _mamba_state_dtype); this calculator has one state type.
const STATE_DTYPE_NOTE = 'state element type (here the whole state; vLLM: the recurrent state only)';
// transformers Gemma3nTextConfig.num_kv_shared_layers: the default a gemma3n_text file leaving the key out takes.
const GEMMA3N_SHARED_DEFAULT = 15;
const integral = (v) => (typeof v === 'number' && Number.isInteger(v) ? v : null);

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
      r.error('num_key_value_heads', `a per-layer list must hold ${fmt(layers)} whole numbers`);
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
  const griffin = r.family === 'recurrent_gemma';
  if (!griffin && r.table.facts.head_dim.aliases.some((a) => r.has(a.key))) return r.fact('head_dim', 1, 65536);
  const hidden = r.fact('hidden_size');
  if (hidden === null || !heads) return null;
  if (hidden % heads) {
    r.error('hidden_size', `${hidden} does not split over ${heads} heads, and head_dim is not given`);
    return null;
  }
  const why = griffin ? 'RecurrentGemmaConfig sets head_dim = hidden_size // num_attention_heads' : '';
  r.note('head dim', 'hidden_size / num_attention_heads', hidden / heads, why);
  return hidden / heads;
}

function mla(r) {
  const latent = r.whole('kv_lora_rank', 'MLA latent rank', 1, 65536);
  const rope = r.whole('qk_rope_head_dim', 'MLA RoPE dims', 0, 65536);
  return latent === null || rope === null ? null : { latent, rope_dim: rope };
}

// vLLM's MiniCPM3 (models/minicpm3.py): plain Attention over every head, K and V both qk_nope + qk_rope wide.
function fullHeads(r, heads) {
  const nope = r.whole('qk_nope_head_dim', 'MLA no-RoPE key dims', 0, 65536, 64, 'transformers MiniCPM3Config default');
  const rope = r.whole('qk_rope_head_dim', 'MLA RoPE dims', 0, 65536);
  const kv = heads; // vLLM: num_kv_heads=self.num_local_heads, the attention heads, whatever num_key_value_heads says
  if (kv === null) r.error('num_attention_heads', "missing: vLLM's MiniCPM3 caches one key and value per attention head");
  else r.note("KV heads (vLLM's MiniCPM3: one per attention head)", 'num_attention_heads', kv);
  if ([nope, rope, kv].includes(null) || nope + rope === 0) return null;
  return { kind: 'full', kv_heads: kv, head_dim: nope + rope };
}

function extras(r, kinds, context, heads) {
  const extra = {};
  if (r.has('kv_lora_rank')) extra.mla = r.table.mla.full_heads.includes(r.family) ? fullHeads(r, heads) : mla(r);
  if (kinds.includes('sliding')) {
    let [key, def, why] = ['sliding_window', null, ''];
    if (r.family === 'recurrent_gemma') [key, def, why] = ['attention_window_size', 2048, 'transformers RecurrentGemmaConfig default'];
    extra.window = r.whole(key, 'sliding window', 1, BIG, def, why);
    if (extra.window && context && extra.window >= context) {
      r.flag(key, `window ${fmt(extra.window)} ≥ the context ${fmt(context)}: it never binds there`);
    }
  }
  if (kinds.includes('chunked')) extra.chunk = r.whole('attention_chunk_size', 'attention chunk');
  if (kinds.includes('linear')) extra.state = stateSize(r);
  if (kinds.includes('cross')) extra.perImage = tokensPerImage(r);
  return extra;
}

function layerOf(kind, kv, dim, extra) {
  if (kind === 'linear') return { kind: 'state', ...(extra.state || { conv: 0, state: 0 }) };
  if (kind === 'cross') return { kind: 'cross', kv_heads: kv, head_dim: dim, per_image: extra.perImage || 1 };
  if (extra.mla) return 'latent' in extra.mla ? { kind: 'mla', ...extra.mla } : { ...extra.mla };
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

// A minimax_m2 attn_type_list of one 1 per layer: vLLM's models/minimax_m2.py never reads the list and gives every
// layer full attention, which the list then says too.
function allFullAttention(r) {
  const types = r.get('attn_type_list');
  const layers = integral(r.get('num_hidden_layers'));
  if (r.family !== 'minimax_m2' || !Array.isArray(types) || types.length !== layers) return false;
  if (types.some((t) => integral(t) !== 1)) return false;
  r.note('attention types (1: full attention in every layer)', 'attn_type_list', `${layers} full`);
  return true;
}

// Keys that change the cache in a way this calculator does not model: the file is refused, the key named.
function refuseUnread(r) {
  for (const entry of r.table.unread) {
    const v = r.get(entry.key);
    if (v === null || v === false || v === 0) continue;
    if (entry.key === 'attn_type_list' && allFullAttention(r)) continue;
    r.error(entry.key, `${entry.why}, so this calculator refuses the file rather than count it wrong`);
  }
}

// Cache layers. LongCat-Flash holds two MLA attentions per decoder layer, each with its own cache (vLLM
// models/longcat_flash.py; transformers LongcatFlashConfig.num_hidden_layers = 2 × num_layers): 2 × num_layers; a
// num_hidden_layers in such a file already counts both.
function layerCount(r) {
  if (!r.table.mla.two_per_layer.includes(r.family) || !r.has('num_layers')) return r.fact('layers', 1, 4096);
  const decoder = r.whole('num_layers', 'decoder layers, two MLA attentions each', 1, 2048);
  const flat = r.get('num_hidden_layers');
  if (decoder === null || (flat !== null && integral(flat) !== 2 * decoder)) {
    if (decoder !== null) r.error('num_hidden_layers', `${shown(flat)} is not 2 × num_layers (${fmt(2 * decoder)}), as LongcatFlashConfig has it`);
    return null;
  }
  r.note('attention layers (2 × num_layers)', 'num_layers', 2 * decoder);
  return 2 * decoder;
}

// An MLA file whose family no engine rule here covers: latent or full heads is the model file's choice.
function refuseMlaFamily(r) {
  const { latent, full_heads: full } = r.table.mla;
  if (r.has('kv_lora_rank') && r.family && !latent.includes(r.family) && !full.includes(r.family)) {
    r.error('kv_lora_rank', `model_type ${r.family}: whether its engines cache the MLA latent or full per-head keys and values is `
      + 'not known here (the latent is counted only for the MLA families whose model file was read), so the file is refused');
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
    if (typeof method !== 'string') return null; // refused by typeFields
    const dtype = own(r.table.weights.quant_method, method);
    if (dtype) {
      const block = own(q, 'weight_block_size');
      const f = own(q, 'fmt');
      let note = `fp8 ${typeof f === 'string' ? f : ''} weights`.replace('  ', ' ');
      if (Array.isArray(block) && block.every((b) => integral(b) !== null)) note += `, one scale per ${block.join(' × ')} block (not counted)`;
      return { dtype, key: 'quantization_config.quant_method', value: method, note };
    }
    r.flag('quantization_config.quant_method', `weights quantised as ${method}: not applied, set the type`);
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

// What each engine caches for this file, where that is said per family (config-keys.json `engines`).
// llama.cpp's MiniCPM3: keys of qk_nope + qk_rope per head, values of hidden_size / heads per head.
function keyValueHeads(r, layers, heads) {
  const full = fullHeads(r, heads);
  const hidden = integral(r.get('hidden_size')); // read quietly: the page's own reading is done and listed
  if (full === null || hidden === null || !heads || hidden % heads) return null;
  return [{ ...full, layers, value_dim: hidden / heads }];
}

function enginesOf(r, kinds, groups, heads) {
  const table = r.table.engines;
  let rule;
  if (own(table, r.family) && r.family !== 'about') rule = table[r.family];
  else if (r.has('kv_lora_rank') && r.table.mla.latent.includes(r.family)) rule = table['mla-latent'];
  else if (kinds.includes('linear')) rule = table.state;
  else return [];
  return rule.map((e) => {
    const engine = { engine: e.engine, source: e.source, groups: e.groups !== 'none' ? groups : null };
    if (e.groups === 'latent') {
      const latent = mla(r);
      engine.groups = latent === null ? null : [{ kind: 'mla', layers: kinds.length, ...latent }];
    }
    if (e.groups === 'key-value-heads') engine.groups = keyValueHeads(r, kinds.length, heads);
    if (e.storage) engine.storage = e.storage;
    return engine;
  });
}

// model_type as a string, or the error for a type field that is not one (a list, an object, a number).
function familyOf(config) {
  const text = own(config, 'text_config');
  for (const [where, prefix] of [[text, 'text_config.'], [config, '']]) {
    const v = own(where, 'model_type');
    if (isObject(where) && v !== undefined && v !== null && typeof v !== 'string') {
      return ['', { field: `${prefix}model_type`, message: `must be a string (got ${shown(v)})` }];
    }
  }
  return [String(own(isObject(text) ? text : {}, 'model_type') || own(config, 'model_type') || ''), null];
}

// Fields that must be strings when present: a list or a number there is refused, not read as something.
function typeFields(r) {
  const places = r.cfg !== r.top ? [[r.top, ''], [r.cfg, r.prefix]] : [[r.top, '']];
  for (const [where, prefix] of places) {
    const method = own(own(where, 'quantization_config'), 'quant_method');
    if (method !== undefined && method !== null && typeof method !== 'string') {
      r.errors.push({ field: `${prefix}quantization_config.quant_method`, message: `must be a string (got ${shown(method)})` });
    }
  }
  const v = r.get('mamba_ssm_dtype');
  if (v !== null && typeof v !== 'string') r.error('mamba_ssm_dtype', `must be a string (got ${shown(v)})`);
}

function refused(message, field = 'config') {
  return {
    groups: [], naive: null, used: [], errors: [{ field, message }], flags: [], contextWindow: null,
    weights: null, stateDtype: null, modelType: '', engines: [],
  };
}

// {groups, naive, used, errors, flags, contextWindow, weights, stateDtype, modelType, engines}: `errors` empty
// means `groups` is the whole model; `flags` are keys read outside the families the table knows them in.
export function readConfig(config, table) {
  if (!isObject(config)) return refused('not a JSON object');
  const text = own(config, 'text_config');
  if (text !== undefined && text !== null && !isObject(text)) return refused('text_config must be an object');
  const [family, badType] = familyOf(config);
  if (badType) return refused(badType.message, badType.field);
  const refusedFamily = own(table.refused_families.families, family);
  if (refusedFamily) return refused(`${family}: ${refusedFamily}, so this calculator refuses the file`, 'model_type');
  const r = new Reader(config, table, family);
  refuseUnread(r);
  refuseMlaFamily(r);
  typeFields(r);
  flagOutsideFamilies(r);
  const layers = layerCount(r);
  const heads = r.fact('attention_heads', 1, BIG, null, 'not given: only the KV heads matter');
  const context = r.fact('context', 1, BIG, null, 'no context limit');
  const weights = weightsOf(r);
  const mambaDtype = r.get('mamba_ssm_dtype');
  const stateDtype = (typeof mambaDtype === 'string' && STATE_TYPES.get(mambaDtype)) || null;
  if (stateDtype) r.note(STATE_DTYPE_NOTE, 'mamba_ssm_dtype', mambaDtype);
  const base = { flags: r.flags, contextWindow: context, weights, stateDtype };
  if (layers === null) return { groups: [], naive: null, used: r.used, errors: r.errors, modelType: r.family, engines: [], ...base };
  const kinds = layerKinds(r, layers) || Array(layers).fill('full');
  const keys = stateKeys(r);
  if (!kinds.includes('linear') && keys.length && !r.errors.length) r.error(keys[0], 'sizes a recurrent state, but no layer of this file is a state layer');
  const needsHeads = kinds.some((k) => k !== 'linear') && !r.has('kv_lora_rank');
  const kv = needsHeads ? kvHeadList(r, layers, heads) : Array(layers).fill(null);
  const dim = needsHeads ? headDim(r, heads) : null;
  const extra = extras(r, kinds, context, heads);
  const perLayer = kinds.map((k, i) => layerOf(k, kv[i], dim, extra));
  const shared = sharedLayers(r, layers);
  for (let i = layers - (shared || 0); i < layers; i += 1) perLayer[i] = { kind: 'shared' };
  const seen = new Map();
  for (const u of r.used) if (!seen.has(`${u.name}\u0000${u.key}`)) seen.set(`${u.name}\u0000${u.key}`, u);
  const groups = grouped(perLayer);
  return {
    groups, naive: naiveOf(r, layers, kv[0], heads, dim), used: [...seen.values()], errors: r.errors,
    modelType: r.family, engines: r.errors.length ? [] : enginesOf(r, kinds, groups, heads), ...base,
  };
}
