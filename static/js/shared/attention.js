// What each new token read from the KV cache, folded from a run's `attention` and `token` events
// (docs/protocol.md "attention"). Pure: no DOM, every function returns new values, so the lab view
// (lab/attention-view.js) and the tests in Chromium (tests/browser/test_attention.py) share it.
import { EVENT } from './protocol.js';

export const ALL_LAYERS = 'all';
export const HEAD_MODES = Object.freeze({ MEAN: 'mean', SHARPEST: 'sharpest' });
export const LEVELS = 4; // highlight strengths, 1 (faint) … 4 (the most-read position)

// prompt: [{text, source}] as /api/prompt's `tokens` gives them (null while not yet known).
export function createAttention(prompt = null) {
  return { prompt, answer: [], reads: {}, layers: 0 };
}

export function withPrompt(state, prompt) {
  return { ...state, prompt };
}

// One server event → the next state; events of other types leave it as it was.
export function applyAttentionEvent(state, event) {
  if (event.type === EVENT.ATTENTION) {
    return { ...state, reads: { ...state.reads, [event.index]: event }, layers: event.layers.length };
  }
  if (event.type === EVENT.TOKEN) {
    return { ...state, answer: [...state.answer, { index: event.index, id: event.id, text: event.text }] };
  }
  return state;
}

// The newest token that has an attention event, or null.
export function newestIndex(state) {
  const indices = Object.keys(state.reads).map(Number);
  return indices.length ? Math.max(...indices) : null;
}

// The positions token `index` read most, [{position, weight}] highest first, for one layer
// (a number) or ALL_LAYERS, over the heads' mean or the sharpest head (not sent for ALL_LAYERS).
export function readsFor(state, index, layer = ALL_LAYERS, mode = HEAD_MODES.MEAN) {
  const event = state.reads[index];
  if (!event) return [];
  const source = layer === ALL_LAYERS ? event.all : event.layers[layer]?.[mode];
  return (source?.top || []).map(([position, weight]) => ({ position, weight }));
}

// position → highlight level 1…LEVELS, by weight relative to the most-read position.
export function highlightLevels(reads) {
  const top = reads.length ? reads[0].weight : 0;
  const levels = new Map();
  if (top <= 0) return levels;
  for (const { position, weight } of reads) levels.set(position, Math.max(1, Math.ceil((weight / top) * LEVELS)));
  return levels;
}

// What sits at a cached position: a prompt token (its source: marker, system, user…) or an answer token.
export function positionOf(state, position) {
  const prompt = state.prompt || [];
  if (position < prompt.length) return { kind: 'prompt', source: prompt[position].source, text: prompt[position].text };
  const answer = state.answer[position - prompt.length];
  return answer ? { kind: 'answer', source: 'answer', text: answer.text, index: answer.index } : null;
}

// The position of the query whose weights chose token `index` (the last token fed in: the prompt's
// last for index 0, else answer token index − 1); it read positions 0 … that one.
export function queryPosition(state, index) {
  return state.reads[index]?.query_position ?? null;
}

export function layerLabel(layer) {
  return layer === ALL_LAYERS ? 'all layers (mean)' : `layer ${layer + 1}`;
}

// Every event of a run folded in: the state a recorded or replayed trace gives.
export function attentionOfEvents(prompt, events) {
  return events.reduce(applyAttentionEvent, createAttention(prompt));
}

// What a strip shows: the token pinned (or else the newest with an attention event), the positions it
// read most for one layer or ALL_LAYERS over the heads' mean or the sharpest head, their highlight
// levels and the query's position. `newest` caps "the newest" (a stage may show fewer tokens).
export function readView(state, { pinned = null, layer = ALL_LAYERS, mode = HEAD_MODES.MEAN, newest = null } = {}) {
  const latest = newest ?? newestIndex(state);
  const index = pinned ?? latest;
  const heads = layer === ALL_LAYERS ? HEAD_MODES.MEAN : mode;
  const reads = index == null ? [] : readsFor(state, index, layer, heads);
  return { index, heads, reads, levels: highlightLevels(reads), query: index == null ? null : queryPosition(state, index) };
}

// The caption: "To choose answer token 3, layer 2, the mean over heads, read most: position 0 “<|im_start|>” (marker) 41.2 %; …".
// How often the prompt's first position is the most-read one, over all layers, across the run's
// attention events: {steps, first, low, high} (its weight's range where it leads), or null without events.
export function firstPositionLead(state) {
  const events = Object.values(state.reads);
  if (!events.length) return null;
  const weights = events.filter((e) => e.all && e.all.top && e.all.top[0] && e.all.top[0][0] === 0).map((e) => e.all.top[0][1]);
  return { steps: events.length, first: weights.length, low: Math.min(...weights), high: Math.max(...weights) };
}

export function readSentence(state, view, layer) {
  const who = view.heads === HEAD_MODES.SHARPEST ? 'its sharpest head' : 'the mean over heads';
  const most = view.reads.slice(0, 3).map(({ position, weight }) => {
    const at = positionOf(state, position);
    return `position ${position}${at ? ` “${at.text.trim() || at.text}” (${at.source})` : ''} ${(weight * 100).toFixed(1)} %`;
  });
  let text = `To choose answer token ${view.index}, ${layerLabel(layer)}, ${who}, read most: ${most.join('; ')}.`;
  // The first position leading is the pattern called an attention sink: say so where it happens.
  const lead = firstPositionLead(state);
  if (view.reads.length && view.reads[0].position === 0 && lead) {
    text += ` Position 0 led at ${lead.first} of this run's ${lead.steps} steps over all layers (${(lead.low * 100).toFixed(0)}–`
      + `${(lead.high * 100).toFixed(0)} %): a first token that takes a large share whatever comes next is an attention sink, `
      + 'so its weight says little about what the token used.';
  }
  return text;
}
