// Pure composer logic (no DOM): the chat messages and the `generate` payload built from what the
// reader typed, stop-string parsing, and the context-budget arithmetic the budget bar draws.
import { formatInt as fmt } from '../shared/format.js';

// System prompt first, then the earlier turns, then the retrieved passage (just before the
// question it supports), then the user message. Blank entries are left out; the user message is
// always sent, so the server can say if it is empty.
export function buildMessages({ system = '', turns = [], retrieved = null, user = '' }) {
  const messages = [];
  if (system.trim()) messages.push({ role: 'system', content: system });
  for (const turn of turns) if (turn.content.trim()) messages.push({ role: turn.role, content: turn.content });
  if (retrieved != null && retrieved.trim()) messages.push({ role: 'retrieved', content: retrieved });
  messages.push({ role: 'user', content: user });
  return messages;
}

// One stop string per line; `\n`, `\t` and `\\` are written as escapes so "\n\n" can be typed.
export function parseStops(text) {
  return text.split('\n')
    .map((line) => line.replace(/\\(n|t|\\)/g, (_, c) => ({ n: '\n', t: '\t', '\\': '\\' })[c]))
    .filter((s) => s.length > 0);
}

// A blank number field means "off" (null); anything else is sent as typed, for the server to judge.
export function numberOrNull(text) {
  const t = String(text).trim();
  if (t === '') return null;
  const n = Number(t);
  return Number.isFinite(n) ? n : t;
}

// The `constraint` a generate frame carries, or null: "force JSON" is any JSON object, "choose one
// of" the non-blank lines as the choices.
export function buildConstraint({ constraint = 'none', choices = '' }) {
  if (constraint === 'json_object') return { kind: 'json_object' };
  if (constraint === 'choice') return { kind: 'choice', spec: choices.split('\n').map((c) => c.trim()).filter(Boolean) };
  return null;
}

export function buildPayload(composer, controls) {
  const sampling = controls.sampling === 'sample'
    ? { temperature: numberOrNull(controls.temperature), top_k: numberOrNull(controls.topK),
        top_p: numberOrNull(controls.topP) ?? 1.0, seed: numberOrNull(controls.seed) }
    : { temperature: 0, top_k: null, top_p: 1.0, seed: null };
  return {
    messages: buildMessages(composer),
    max_new_tokens: numberOrNull(controls.maxNewTokens),
    sampling,
    stop: parseStops(controls.stop || ''),
    delivery: controls.delivery,
    kv_cache: controls.kvCache,
    prefill_chunk: numberOrNull(controls.prefillChunk) ?? 0,
    overflow: controls.overflow,
    ...(buildConstraint(controls) ? { constraint: buildConstraint(controls) } : {}),
  };
}

// The budget bar's parts as fractions of the drawn width. The drawn scale is the window or the
// request, whichever is larger, so an overflow shows as a part beyond the window line.
export function budgetParts({ prompt_tokens: prompt, max_new_tokens: output, context_window: window }) {
  const total = prompt + output;
  const scale = Math.max(window, total) || 1;
  return {
    total,
    over: Math.max(0, total - window),
    free: Math.max(0, window - total),
    promptFrac: Math.min(prompt, window) / scale,
    outputFrac: Math.max(0, Math.min(total, window) - prompt) / scale,
    overFrac: Math.max(0, total - window) / scale,
    windowFrac: window / scale,
  };
}

// The decision in words, from the server's budget object.
export function describeBudget(budget) {
  const { action, prompt_tokens: p, max_new_tokens: m, requested_max_new_tokens: req, context_window: w } = budget;
  const sum = `${fmt(p)} prompt + ${fmt(m)} new = ${fmt(p + m)} of ${fmt(w)} tokens`;
  if (action === 'truncated_history') {
    const n = budget.dropped_messages;
    return `Fits after dropping the ${n === 1 ? 'oldest earlier message' : `${n} oldest earlier messages`}: ${sum}.`;
  }
  if (action === 'shrunk_output') return `Fits with max new tokens lowered from ${fmt(req)} to ${fmt(m)}: ${sum}.`;
  return `Fits: ${sum}${p + m === w ? ' (exactly full)' : ''}.`;
}

// The rejection in words, when the prompt alone is known (counted with max_new_tokens = 1).
export function describeRejection(promptTokens, requested, window) {
  const total = promptTokens + requested;
  return `Rejected: ${fmt(promptTokens)} prompt + ${fmt(requested)} new = ${fmt(total)} tokens, `
    + `${fmt(total - window)} over the ${fmt(window)}-token window. Pick another policy or ask for fewer tokens.`;
}
