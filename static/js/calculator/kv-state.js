// The per-sequence state of a state layer (Mamba, Jamba, gated linear attention, RecurrentGemma's recurrent block),
// no DOM: the twin of formulas/kv_state.py. Conv and recurrent elements per layer as transformers' caches shape
// them, each size refused under the file's key when it passes what kv-layers.js holds.

import { BIG, fmt } from './kv-reader.js';

const MAX_STATE = 2 ** 40; // elements of one layer's state: past it a value is a typo or a test
const STATE_KEYS = ['linear_num_value_heads', 'linear_conv_kernel_dim', 'lru_width', 'conv1d_width'];

// A state size from its factors, refused under `key` (the file's key) when it passes MAX_STATE. BigInt keeps the
// product exact, as Python's integers do, so the message names the same total.
function bounded(r, key, parts, what) {
  const total = parts.reduce((a, p) => a * BigInt(p), 1n);
  if (total > BigInt(MAX_STATE)) {
    const said = parts.map((p) => fmt(p)).join(' × ');
    r.error(key, `${said} = ${total.toLocaleString('en-US')} ${what} elements a layer, past the 2^40 this calculator holds`);
    return null;
  }
  return Number(total);
}

function keyOf(r, fact) {
  const spec = r.table.facts[fact];
  const hit = spec.aliases.find((a) => r.has(a.key));
  return hit ? hit.key : spec.standard;
}

function mambaState(r) {
  const expand = r.fact('mamba_expand');
  const conv = r.fact('mamba_conv');
  const size = r.fact('mamba_state');
  const hidden = r.fact('hidden_size');
  if ([expand, conv, size, hidden].includes(null)) return null;
  const convTotal = bounded(r, keyOf(r, 'mamba_conv'), [expand, hidden, conv], 'conv');
  const stateTotal = bounded(r, keyOf(r, 'mamba_state'), [expand, hidden, size], 'recurrent');
  if (convTotal === null || stateTotal === null) return null;
  return { conv: convTotal, state: stateTotal, conv_kernel: conv };
}

function linearState(r) {
  const nk = r.whole('linear_num_key_heads', 'linear key heads', 1, 65536);
  const dk = r.whole('linear_key_head_dim', 'linear key dim', 1, 65536);
  const nv = r.whole('linear_num_value_heads', 'linear value heads', 1, 65536);
  const dv = r.whole('linear_value_head_dim', 'linear value dim', 1, 65536);
  const kernel = r.whole('linear_conv_kernel_dim', 'linear conv width', 1, 1024);
  if ([nk, dk, nv, dv, kernel].includes(null)) return null;
  const conv = bounded(r, 'linear_conv_kernel_dim', [2 * nk * dk + nv * dv, kernel], 'conv');
  const state = bounded(r, 'linear_value_head_dim', [nv, dk, dv], 'recurrent');
  return conv === null || state === null ? null : { conv, state, conv_kernel: kernel };
}

// RecurrentGemma's recurrent block per sequence (transformers RecurrentGemmaRecurrentBlock): the conv1d_state carried
// from prefill through decode is x_branch, lru_width × (conv1d_width − 1) in the model's type (_setup_cache allocates
// hidden_size channels, equal in every published file), and the RG-LRU state lru_width in float32.
function griffinState(r) {
  const hidden = r.fact('hidden_size');
  const width = r.whole('conv1d_width', 'conv1d width', 1, 1024, 4, 'transformers RecurrentGemmaConfig default');
  const lru = r.whole('lru_width', 'RG-LRU width', 1, BIG, hidden, 'transformers RecurrentGemmaConfig: hidden_size');
  if ([hidden, width, lru].includes(null)) return null;
  if (lru !== hidden) r.flag('lru_width', `${fmt(lru)} ≠ hidden_size ${fmt(hidden)}: the conv state is counted lru_width wide, as decode fills it`);
  const conv = bounded(r, 'conv1d_width', [lru, width - 1], 'conv');
  return conv === null ? null : { conv, state: lru, recurrent_bytes: 4 };
}

export function stateKeys(r) {
  const facts = ['mamba_state', 'mamba_conv', 'mamba_expand'];
  return [...facts.flatMap((f) => r.table.facts[f].aliases.map((a) => a.key).filter((k) => r.has(k))),
    ...STATE_KEYS.filter((k) => r.has(k))];
}

// Conv and recurrent elements per state layer per sequence, as transformers' caches shape them (a Mamba conv state
// keeps conv_kernel columns there; vLLM keeps conv_kernel − 1, and kv-layers.js applies the choice).
export function stateSize(r) {
  if (r.family === 'recurrent_gemma') return griffinState(r);
  if (r.table.facts.mamba_state.aliases.some((a) => r.has(a.key))) return mambaState(r);
  if (r.has('linear_num_value_heads')) return linearState(r);
  r.error('layer_types', 'linear-attention layers, but no mamba_* / state_size or linear_* keys to size their state');
  return null;
}
