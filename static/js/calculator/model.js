// Which model the calculator computes, no DOM: the state's preset resolved to layer groups, the one-formula
// (naive) reading beside them, and where the numbers came from. A bundled or pasted config is read with
// kv-config.js and the key table (static/data/config-keys.json); a preset, the live model or typed numbers are one
// group of full attention. A pasted config's text is parsed and read once per distinct text, not on every redraw.
import { isObject, own, readConfig } from './kv-config.js';

// Beside the table's own keys, the ones a pasted config keeps (and shares in the link): the reader uses them.
const EXTRA_KEYS = [
  'model_type', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'head_dim', 'hidden_size',
  'max_position_embeddings', 'qk_nope_head_dim', 'v_head_dim', 'linear_num_key_heads', 'linear_key_head_dim',
  'linear_value_head_dim', 'linear_conv_kernel_dim', 'mamba_d_state', 'mamba_d_conv', 'mamba_expand', 'torch_dtype',
  'dtype', 'quantization_config', 'attn_config', 'mamba_ssm_dtype', 'conv1d_width', 'vision_config',
  'new_decoder_architecture', 'no_rope_layers', '_block_types',
];
const NESTED_KEEP = {
  quantization_config: ['quant_method', 'fmt', 'weight_block_size'], attn_config: ['kv_n_heads'],
  vision_config: ['image_size', 'patch_size', 'max_num_tiles'],
};

// The keys a pasted config keeps, from the table: every alias (its first part: attn_config.kv_n_heads keeps
// attn_config), every known and refused key, and the extra ones above.
export function configKeys(table) {
  const keys = new Set(EXTRA_KEYS);
  for (const fact of Object.values(table.facts)) for (const a of fact.aliases) keys.add(a.key.split('.')[0]);
  for (const key of Object.keys(table.known)) keys.add(key);
  for (const entry of table.unread) keys.add(entry.key);
  keys.add(table.multi_query.key);
  return [...keys];
}

function pick(obj, keys) {
  const entries = [];
  for (const k of keys) {
    let v = own(obj, k);
    if (v === undefined) continue;
    if (k in NESTED_KEEP && isObject(v)) v = Object.fromEntries(NESTED_KEEP[k].filter((n) => own(v, n) !== undefined).map((n) => [n, v[n]]));
    entries.push([k, v]);
  }
  return Object.fromEntries(entries); // own data properties only: a key named __proto__ stays a plain key
}

// The relevant part of a parsed config.json (its text_config too, for multimodal files).
export function relevantConfig(config, table) {
  const keys = configKeys(table);
  const out = pick(config, keys);
  const text = own(config, 'text_config');
  if (isObject(text)) out.text_config = pick(text, keys);
  else if (text !== undefined && text !== null) out.text_config = text; // kept, so the reader refuses it as the file has it
  return out;
}

const NON_FINITE = { NaN, Infinity, '-Infinity': -Infinity };
const MARK = '\u0000kvscope-non-finite:'; // as parsed; written into the text escaped, a NUL not being allowed raw

// JSON text as Python's json module reads it: bare NaN, Infinity and -Infinity (which transformers writes, e.g.
// Nemotron-H's time_step_limit) become those numbers; everything else as JSON.parse reads it.
export function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch (err) {
    const marked = markNonFinite(text);
    if (marked === text) throw err;
    try {
      return JSON.parse(marked, (_, v) => (typeof v === 'string' && v.startsWith(MARK) ? NON_FINITE[v.slice(MARK.length)] : v));
    } catch {
      throw err; // the first complaint names the text as written
    }
  }
}

// The bare non-finite tokens outside strings, each replaced by a marked string.
function markNonFinite(text) {
  let out = '';
  let from = 0;
  let inString = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i += 1;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') { inString = true; continue; }
    const token = ['-Infinity', 'Infinity', 'NaN'].find((t) => text.startsWith(t, i));
    if (token) {
      out += `${text.slice(from, i)}"\\u0000kvscope-non-finite:${token}"`;
      i += token.length - 1;
      from = i + 1;
    }
  }
  return from ? out + text.slice(from) : text;
}

// {config, error}: text to a config object, or a message naming what is wrong with it.
export function parseConfigText(text, table) {
  let value;
  try {
    value = parseJson(text);
  } catch (err) {
    return { config: null, error: { field: 'config.json', message: `not valid JSON (${err.message})` } };
  }
  if (!isObject(value)) {
    return { config: null, error: { field: 'config.json', message: 'must be a JSON object like a config.json file' } };
  }
  return { config: relevantConfig(value, table), error: null };
}

export function simpleGroups(state) {
  return [{ kind: 'full', layers: state.layers, kv_heads: state.kvHeads, head_dim: state.headDim }];
}

// One remembered reading: the page redraws often, a pasted text changes rarely.
let lastRead = { text: null, read: null };
function readText(text, table) {
  if (lastRead.text !== text) {
    const parsed = parseConfigText(text, table);
    lastRead = { text, read: parsed.config ? readConfig(parsed.config, table) : null };
  }
  return lastRead.read;
}

// {groups, naive, read (null for a simple model), entry (the catalogue entry, if any), rejected}.
export function resolveModel(state, catalogue, table) {
  let read = null;
  let entry = null;
  if (state.preset && state.preset.startsWith('cfg:')) {
    entry = catalogue.find((m) => `cfg:${m.id}` === state.preset) || null;
    read = entry ? readConfig(entry.config, table) : null;
  } else if (state.preset === 'pasted' && state.config) {
    read = readText(state.config, table);
  }
  if (read && !read.errors.length) return { groups: read.groups, naive: read.naive, read, entry };
  const naive = { layers: state.layers, kv_heads: state.kvHeads, head_dim: state.headDim };
  // `rejected`: a config that did not read (its errors name the keys); the caller says so.
  return { groups: simpleGroups(state), naive, read: null, entry: null, rejected: read && read.errors.length ? read : null };
}
