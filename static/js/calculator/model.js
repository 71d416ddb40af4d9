// Which model the calculator computes, no DOM: the state's preset resolved to layer groups, the one-formula
// (naive) reading beside them, and where the numbers came from. A bundled or pasted config is read with
// kv-config.js; a preset, the live model or typed numbers are one group of full attention.
import { readConfig } from './kv-config.js';

// Only these keys of a pasted config are kept (and shared in the link): the ones the reader can use.
export const CONFIG_KEYS = [
  'model_type', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'head_dim', 'hidden_size',
  'max_position_embeddings', 'layer_types', 'sliding_window', 'use_sliding_window', 'sliding_window_pattern',
  'attention_chunk_size', 'no_rope_layers', 'no_rope_layer_interval', 'attn_layer_period', 'attn_layer_offset',
  'full_attention_interval', 'kv_lora_rank', 'qk_rope_head_dim', 'mamba_d_state', 'mamba_d_conv', 'mamba_expand',
  'linear_num_key_heads', 'linear_num_value_heads', 'linear_key_head_dim', 'linear_value_head_dim',
  'linear_conv_kernel_dim', 'num_kv_shared_layers', 'torch_dtype',
];

function pick(obj) {
  return Object.fromEntries(CONFIG_KEYS.filter((k) => k in obj).map((k) => [k, obj[k]]));
}

// The relevant part of a parsed config.json (its text_config too, for multimodal files).
export function relevantConfig(config) {
  const out = pick(config);
  const text = config.text_config;
  if (text && typeof text === 'object' && !Array.isArray(text)) out.text_config = pick(text);
  return out;
}

// {config, error}: text to a config object, or a message naming what is wrong with it.
export function parseConfigText(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { config: null, error: { field: 'config.json', message: `not valid JSON (${err.message})` } };
  }
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    return { config: null, error: { field: 'config.json', message: 'must be a JSON object like a config.json file' } };
  }
  return { config: relevantConfig(value), error: null };
}

export function simpleGroups(state) {
  return [{ kind: 'full', layers: state.layers, kv_heads: state.kvHeads, head_dim: state.headDim }];
}

// {groups, naive, read (null for a simple model), entry (the catalogue entry, if any)}.
export function resolveModel(state, catalogue) {
  let config = null;
  let entry = null;
  if (state.preset && state.preset.startsWith('cfg:')) {
    entry = catalogue.find((m) => `cfg:${m.id}` === state.preset) || null;
    config = entry ? entry.config : null;
  } else if (state.preset === 'pasted' && state.config) {
    config = parseConfigText(state.config).config;
  }
  if (config) {
    const read = readConfig(config);
    if (!read.errors.length) return { groups: read.groups, naive: read.naive, read, entry };
  }
  const naive = { layers: state.layers, kv_heads: state.kvHeads, head_dim: state.headDim };
  return { groups: simpleGroups(state), naive, read: null, entry: null };
}
