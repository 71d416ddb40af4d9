// Each layer's kind before sharing (full, sliding, chunked, linear: a per-sequence state, cross: attention over an
// image's positions), no DOM: the twin of formulas/kv_patterns.py. From layer_types when the file has one, else the
// rule of transformers' config class for the model_type, and a cross-attention layer's positions per image; the
// sources per rule are in docs/calculator.md.

import { BIG, Reader, fmt, isObject, own, shown } from './kv-reader.js';

const TYPE_NAMES = new Map([
  ['full_attention', 'full'], ['attention', 'full'], ['sliding_attention', 'sliding'], ['chunked_attention', 'chunked'],
  ['linear_attention', 'linear'], ['mamba', 'linear'],
]);
// Qwen2Config's windows; MiMo is a Qwen2 model (vLLM models/mimo.py MiMoModel(Qwen2Model)).
const QWEN_WINDOWED = ['qwen2', 'qwen3', 'qwen3_moe', 'qwen3_vl_text', 'mimo'];
// transformers RecurrentGemmaConfig.layers_block_type: block_types cycled over the layers.
const GRIFFIN_BLOCKS = new Map([['recurrent', 'linear'], ['attention', 'sliding']]);
const GRIFFIN_DEFAULT = ['recurrent', 'recurrent', 'attention'];
// transformers MllamaTextConfig.__post_init__: the cross-attention layers a file leaving the key out gets.
const MLLAMA_TYPES = ['mllama', 'mllama_text_model'];
const MLLAMA_CROSS_DEFAULT = [3, 8, 13, 18, 23, 28, 33, 38];
const integral = (v) => (typeof v === 'number' && Number.isInteger(v) ? v : null);

export function countText(kinds) {
  return [...new Set(kinds)].map((k) => `${kinds.filter((x) => x === k).length} ${k}`).join(', ');
}

function every(r, layers, n, most, nth, rule) {
  const out = Array.from({ length: layers }, (_, i) => ((i + 1) % n === 0 ? nth : most));
  if (rule) r.note('layer kinds', 'model_type', countText(out), rule);
  return out;
}

// One error for a bad list, naming the first bad entry and how many there are.
function fromLayerTypes(r, layers) {
  const types = r.get('layer_types');
  if (!Array.isArray(types)) {
    r.error('layer_types', `must be a list of ${fmt(layers)} layer kinds (got ${shown(types)})`);
    return null;
  }
  if (types.length !== layers) {
    r.error('layer_types', `has ${fmt(types.length)} entries for ${fmt(layers)} layers (num_hidden_layers)`);
    return null;
  }
  const bad = [];
  types.forEach((t, i) => { if (typeof t !== 'string' || !TYPE_NAMES.has(t)) bad.push(i); });
  if (bad.length) {
    r.error('layer_types', `${fmt(bad.length)} unknown ${bad.length === 1 ? 'entry' : 'entries'}, the first layer_types[${bad[0]}] = ${shown(types[bad[0]])}; `
      + `known: ${[...TYPE_NAMES.keys()].join(', ')}`);
    return null;
  }
  const out = types.map((t) => TYPE_NAMES.get(t));
  r.note('layer kinds', 'layer_types', countText(out));
  return out;
}

function llama4(r, layers) {
  const given = r.get('no_rope_layers');
  if (Array.isArray(given) && given.length) {
    if (given.length !== layers || given.some((v) => integral(v) !== 0 && integral(v) !== 1)) {
      r.error('no_rope_layers', `must be a list of ${fmt(layers)} entries, each 0 or 1`);
      return null;
    }
    r.note('RoPE (chunked) layers', 'no_rope_layers', given.filter((v) => v === 1).length);
    return given.map((v) => (v === 1 ? 'chunked' : 'full'));
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

// transformers JambaConfig: attention where i % attn_layer_period == attn_layer_offset; it raises when the offset
// is not below the period (no layer would be attention).
function jamba(r, layers) {
  const period = r.whole('attn_layer_period', 'attention layer period');
  const offset = r.whole('attn_layer_offset', 'attention layer offset', 0);
  if (period === null || offset === null) return null;
  if (offset >= period) {
    r.error('attn_layer_offset', `${fmt(offset)} must be below attn_layer_period (${fmt(period)}), as JambaConfig requires`);
    return null;
  }
  return Array.from({ length: layers }, (_, i) => (i % period === offset ? 'full' : 'linear'));
}

// The private _block_types that transformers 4.x wrote into RecurrentGemma files; 5.23 does not read it and takes
// the default pattern, so a file whose _block_types differs from that default is refused, not guessed.
function defaultBlocksAgree(r) {
  const old = r.get('_block_types');
  if (old === null || (Array.isArray(old) && old.length === GRIFFIN_DEFAULT.length && old.every((b, i) => b === GRIFFIN_DEFAULT[i]))) return true;
  r.error('_block_types', `${shown(old)} is not the default pattern transformers 5.23 reads instead (it ignores _block_types); set block_types`);
  return false;
}

// RecurrentGemma (Griffin): block_types repeated over the layers (RecurrentGemmaConfig.layers_block_type).
function griffin(r, layers) {
  let blocks = r.get('block_types');
  let why = '';
  if (blocks === null && !defaultBlocksAgree(r)) return null;
  if (blocks === null) { blocks = GRIFFIN_DEFAULT; why = 'transformers RecurrentGemmaConfig default'; }
  if (!Array.isArray(blocks) || !blocks.length || blocks.some((b) => typeof b !== 'string' || !GRIFFIN_BLOCKS.has(b))) {
    r.error('block_types', `must be a list of ${[...GRIFFIN_BLOCKS.keys()].join(', ')} (got ${shown(blocks)})`);
    return null;
  }
  const out = Array.from({ length: layers }, (_, i) => GRIFFIN_BLOCKS.get(blocks[i % blocks.length]));
  r.note('layer kinds (block_types repeated)', 'block_types', countText(out), why);
  return out;
}

// Mllama: the layers in cross_attention_layers attend to the image's positions, not the text's.
function crossLayers(r, layers, kinds) {
  let given = r.get('cross_attention_layers');
  if (given === null && layers <= Math.max(...MLLAMA_CROSS_DEFAULT)) {
    r.error('cross_attention_layers', `missing, and MllamaTextConfig's default [3, 8, …, 38] needs more than ${layers} layers`);
    return null;
  }
  if (given === null) {
    given = MLLAMA_CROSS_DEFAULT;
    r.flag('cross_attention_layers', "missing: transformers MllamaTextConfig's default [3, 8, …, 38] is used");
  }
  if (!Array.isArray(given) || given.some((i) => integral(i) === null || i < 0 || i >= layers)) {
    r.error('cross_attention_layers', `must be a list of layer numbers from 0 to ${fmt(layers - 1)}`);
    return null;
  }
  const cross = new Set(given);
  r.note('cross-attention layers', 'cross_attention_layers', cross.size, r.has('cross_attention_layers') ? '' : 'transformers MllamaTextConfig default');
  return kinds.map((k, i) => (cross.has(i) ? 'cross' : k));
}

// Mllama's cached positions per image: max_num_tiles tiles of (image_size // patch_size)² + 1 patches each.
export function tokensPerImage(r) {
  const vision = own(r.top, 'vision_config');
  if (!isObject(vision)) {
    // A top-level key, not the text part's.
    r.errors.push({ field: 'vision_config', message: "missing or not an object: needed for the cross-attention layers' positions per image" });
    return null;
  }
  const sub = new Reader(vision, r.table, r.family);
  sub.prefix = 'vision_config.';
  const defaults = 'transformers MllamaVisionConfig default';
  const size = sub.whole('image_size', 'image size', 1, 65536, 448, defaults);
  const patch = sub.whole('patch_size', 'patch size', 1, 65536, 14, defaults);
  const tiles = sub.whole('max_num_tiles', 'tiles per image', 1, 64, 4, defaults);
  r.errors.push(...sub.errors);
  r.used.push(...sub.used);
  if ([size, patch, tiles].includes(null)) return null;
  const perImage = tiles * (Math.floor(size / patch) ** 2 + 1);
  // A top-level key, not the text part's.
  r.used.push({ name: 'positions per image (tiles × ((image_size // patch_size)² + 1))', key: 'vision_config', value: perImage });
  return perImage;
}

function base(r, layers) {
  const kind = r.family;
  if (r.get('layer_types') !== null) return fromLayerTypes(r, layers);
  if (kind === 'recurrent_gemma') return griffin(r, layers);
  if (kind === 'gemma2') return every(r, layers, 2, 'sliding', 'full', 'transformers Gemma2Config: every second layer is full');
  if (kind === 'gemma3' || kind === 'gemma3_text' || (r.has('sliding_window_pattern') && kind !== 'cohere2')) {
    return gemma3(r, layers, 6, 'transformers Gemma3TextConfig');
  }
  if (kind === 'cohere2') return gemma3(r, layers, 4, 'transformers Cohere2Config');
  if (kind === 'gemma3n_text') return every(r, layers, 5, 'sliding', 'full', 'transformers Gemma3nTextConfig: every fifth layer full');
  if (r.has('attention_chunk_size')) return llama4(r, layers);
  if (r.has('attn_layer_period')) return jamba(r, layers);
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

// Each layer's kind before sharing; null (with an error recorded) when the pattern cannot be read.
export function layerKinds(r, layers) {
  const kinds = base(r, layers);
  if (kinds !== null && (r.has('cross_attention_layers') || MLLAMA_TYPES.includes(r.family))) return crossLayers(r, layers, kinds);
  return kinds;
}
