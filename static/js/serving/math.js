// Pure arithmetic for the "Many requests at once" chapter, no DOM: token passes with and without a KV
// cache, the context budget, grid tallies and the speculative-decoding counts.

export const PASS_LIMITS = { prompt: [1, 100000], reply: [1, 100000] };

// Token passes for a prompt of `prompt` tokens and a reply of `reply` tokens. Without a cache every
// new token re-reads everything so far (prompt + i for the i-th token); with one, each position
// goes through the model once. 1,000 + 500 → 625,250 vs 1,500.
export function tokenPasses(prompt, reply) {
  const noCache = reply * prompt + (reply * (reply + 1)) / 2;
  const withCache = prompt + reply;
  return { noCache, withCache, ratio: noCache / withCache };
}

// null when the value is a whole number within the field's limits, else the message that names both.
export function checkCount(field, value) {
  const [lo, hi] = PASS_LIMITS[field];
  if (!Number.isInteger(value) || value < lo || value > hi) {
    return `${field === 'prompt' ? 'Prompt' : 'Reply'} length must be a whole number from ${lo} to ${hi.toLocaleString('en-US')}`;
  }
  return null;
}

// Positions a request may occupy: the rendered prompt (content + template) plus the answer budget.
export function contextUse({ content, template, maxNew, window }) {
  const prompt = content + template;
  const used = prompt + maxNew;
  return { prompt, used, window, fits: used <= window, free: window - used };
}

// A log10 scale from [lo, hi] onto [r0, r1].
export function logScale([lo, hi], [r0, r1]) {
  const a = Math.log10(lo);
  const b = Math.log10(hi);
  return (v) => r0 + ((Math.log10(v) - a) / (b - a)) * (r1 - r0);
}

// Whole decades around every value, so each point sits inside the plotted range.
export function decades(values) {
  const xs = values.filter((v) => Number.isFinite(v) && v > 0);
  if (!xs.length) return [1, 10];
  const lo = 10 ** Math.floor(Math.log10(Math.min(...xs)));
  let hi = 10 ** Math.ceil(Math.log10(Math.max(...xs)));
  if (hi <= lo) hi = lo * 10;
  return [lo, hi];
}

// How many cells of each state a run's step-by-request grid holds.
export function cellCounts(run) {
  const counts = {};
  for (const step of run.steps) for (const state of Object.values(step.cells)) counts[state] = (counts[state] || 0) + 1;
  return counts;
}

// Slots of a batch of `slots` that ran nothing at this step (a request running = prefill or decode).
export function freeSlots(step, slots) {
  const running = Object.values(step.cells).filter((s) => s === 'prefill' || s === 'decode').length;
  return Math.max(0, slots - running);
}

// The request names of a grid, in the order the workload lists them (then any others it meets).
export function gridRequests(workload, run) {
  const names = (workload || []).map((w) => w.request);
  for (const step of run.steps) for (const name of Object.keys(step.cells)) if (!names.includes(name)) names.push(name);
  return names;
}

// The blocks of a frame, each with its owner (or null) and whether several requests share it.
// `owners[i]` is block `blockIds[i]` (the blocks the run touched); `shared` lists block ids, which
// are the positions themselves when the result gives no ids.
export function blockCells(frame, blockIds = null) {
  const shared = new Set(frame.shared || []);
  return frame.owners.map((owner, i) => ({ owner: owner ?? null, shared: shared.has(blockIds ? blockIds[i] : i) }));
}

// A value as a share of the largest of `values`, for bar lengths (0 when nothing is positive).
export function share(value, values) {
  const top = Math.max(0, ...values.filter(Number.isFinite));
  return top > 0 && Number.isFinite(value) ? value / top : 0;
}

// One speculative step as token chips: the first `accepted` proposals kept, the rest rejected,
// then the model's own next token.
export function specChips(step) {
  const chips = (step.proposed || []).map((text, i) => ({ text, kind: i < step.accepted ? 'accepted' : 'rejected' }));
  if (step.bonus != null) chips.push({ text: step.bonus, kind: 'bonus' });
  return chips;
}

// A token's text made visible: a line break as ↵, an empty token as ∅ (the rest unchanged).
export function visibleToken(text) {
  if (text === '') return '∅';
  const shown = String(text).replace(/\r?\n/g, '↵');
  return shown.trim() === '' ? shown.replace(/ /g, '␣') : shown; // a token of spaces alone would look empty
}

// The frame where the most blocks are held: the moment the block map opens on.
export function peakFrame(frames) {
  let best = 0;
  frames.forEach((f, i) => { if (held(f) > held(frames[best])) best = i; });
  return best;
}

const held = (frame) => frame.owners.filter((o) => o != null).length;

// Acceptance rate from a case's own counts (the page shows the measured one and checks they agree).
export function acceptance(accepted, proposed) {
  return proposed > 0 ? accepted / proposed : null;
}
