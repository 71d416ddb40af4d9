// The walkthrough's stages and, for a stage index and a derived run (trace.js deriveRun), the exact
// state the figure shows. Pure and total: the state depends only on (index, run), so scrolling back
// to a stage restores it exactly.
import { MISSING, formatFixed, formatInt, formatMs, formatSize } from '../shared/format.js';
import { EVENT } from '../shared/protocol.js';
import { median } from '../shared/stats.js';
import { decodeTokensPerS } from '../shared/cost.js';

export const STAGES = [
  { name: 'input', title: 'Assembling the input', focus: 'messages', panel: 'messages', timeline: null },
  { name: 'template', title: 'The chat template', focus: 'prompt', panel: 'rendered', timeline: null },
  { name: 'tokens', title: 'The tokenizer', focus: 'prompt', panel: 'tokens', timeline: null },
  { name: 'queue', title: 'Waiting in the queue', focus: 'queue', panel: 'answer', timeline: 'queue' },
  { name: 'prefill', title: 'Prefill: the whole prompt in one pass', focus: 'model', panel: 'answer', timeline: 'prefill' },
  { name: 'first-token', title: 'The first token', focus: 'prompt', panel: 'candidates', timeline: 'prefill' },
  { name: 'decode', title: 'The decode loop', focus: 'model', panel: 'answer', timeline: 'decode' },
  { name: 'cache', title: 'The KV cache grows', focus: 'cache', panel: 'answer', timeline: 'decode' },
  { name: 'delivery', title: 'Delivery', focus: 'panel', panel: 'answer', timeline: 'decode' },
  { name: 'end', title: 'The end', focus: 'panel', panel: 'answer', timeline: null },
  { name: 'map', title: 'Reading the figure as a map', focus: null, panel: 'answer', timeline: 'all' },
];
const AT = Object.fromEntries(STAGES.map((s, i) => [s.name, i]));
export const LAST = STAGES.length - 1;

export function stageIndex(name) {
  return name in AT ? AT[name] : -1;
}

export function clampStage(i) {
  return Math.max(0, Math.min(LAST, i));
}

// The stage a live or replayed run is in, from its latest event (trace.js sets run.phase).
export function stageForPhase(phase) {
  return stageIndex(phase === 'submitted' ? 'queue' : phase === 'queued' ? 'queue' : phase);
}

const MESSAGE_LABELS = { system: 'system', user: 'user', assistant: 'assistant', retrieved: 'retrieved' };

function messagesState(i, run) {
  const lastUser = run.messages.map((m) => m.role).lastIndexOf('user');
  return {
    dim: i >= 1 && i < LAST,
    items: run.messages.map((m) => ({
      role: m.role,
      label: m.index === lastUser ? 'question' : MESSAGE_LABELS[m.role] || m.role,
      tokens: m.tokens,
    })),
  };
}

function queueState(i, run) {
  const q = run.queue;
  let state = 'empty';
  if (i === AT.queue && q.entered) state = 'waiting';
  else if (i > AT.queue) state = run.prefill.started ? 'left' : q.entered ? 'waiting' : 'empty';
  // While still waiting (a live run) the latest place in line; afterwards, where it joined the queue.
  const now = !run.prefill.started;
  return { state, position: now ? q.position : q.firstPosition, ahead: now ? q.ahead : q.firstAhead, waitMs: q.waitMs };
}

function prefillState(i, run) {
  const p = run.prefill;
  const state = i < AT.prefill || !p.started ? 'idle' : p.done ? 'done' : 'running';
  return { state, fill: state === 'done' ? 1 : 0, tokens: p.tokens, ms: p.ms, tokensPerS: p.tokensPerS };
}

function generatedCount(i, run) {
  if (i < AT['first-token']) return 0;
  if (i === AT['first-token']) return Math.min(1, run.tokens.length);
  return run.tokens.length;
}

function cacheColumns(i, run, shown) {
  if (i < AT.prefill || !run.prefill.done) return 0;
  if (shown === 0) return run.prefill.cacheTokens;
  return run.tokens[shown - 1].cacheTokens;
}

export function figureState(i, run, source = run.measured ? 'recorded' : 'schematic') {
  const index = clampStage(i);
  const stage = STAGES[index];
  const shown = generatedCount(index, run);
  const promptCount = run.prompt.tokens.length;
  const columns = cacheColumns(index, run, shown);
  return {
    index,
    name: stage.name,
    title: stage.title,
    focus: stage.focus,
    panel: stage.panel,
    source,
    measured: run.measured,
    messages: messagesState(index, run),
    prompt: {
      shown: index >= AT.template,
      sources: run.prompt.tokens.map((t) => t.source),
      highlight: index === AT.tokens && run.splitWord ? run.splitWord.positions : [],
    },
    generated: shown,
    queue: queueState(index, run),
    prefill: prefillState(index, run),
    decodeSteps: Math.max(0, shown - 1),
    cache: {
      columns,
      promptColumns: Math.min(columns, promptCount),
      capacity: Math.max(promptCount + run.maxNewTokens, columns, 1),
      bytes: shown ? run.tokens[shown - 1].cacheBytes : columns ? run.prefill.cacheBytes : 0,
    },
    output: {
      tokens: run.tokens.slice(0, shown),
      boundaries: index === AT.delivery || index === LAST,
      candidates: index === AT['first-token'] && run.firstToken ? run.firstToken.candidates || [] : null,
    },
    end: index >= AT.end && run.end ? run.end : null,
    timeline: stage.timeline,
  };
}

// ---- the end of a run, in words ---------------------------------------------------------------

const END_WORDS = {
  eos: 'the model produced its end token',
  max_tokens: 'it used the whole token budget',
  stop_string: 'a stop string appeared',
  context_full: 'the context window was full',
  timeout: 'the time limit ran out',
  cancelled: 'it was cancelled',
};

// Whether the answer ended on its own terms: an end token or a stop string. A budget, a full
// context, a timeout, a cancel or an error leave it cut short, and the figure says so.
export function answerComplete(end) {
  return !!end && end.type === EVENT.FINISHED && (end.reason === 'eos' || end.reason === 'stop_string');
}

export function endSentence(end) {
  if (!end) return '';
  if (end.type === EVENT.ERROR) return `Error (${end.reason}): ${end.message || 'no answer'} — the answer is incomplete.`;
  if (end.type === EVENT.CANCELLED) return `Cancelled (${end.cause || 'client'}, during ${end.state || '?'}) — the answer is incomplete.`;
  const why = END_WORDS[end.reason] || end.reason;
  return `Finished: ${end.reason} — ${why}.${answerComplete(end) ? '' : ' The answer may be cut short.'}`;
}

// Where each story fact comes from: read off the run on display (measured; schematic for a synthetic
// run), or worked out from it by arithmetic (computed). index.js writes it into data-provenance.
// The model's own configuration and the request's settings are inputs of the run, not findings: they
// carry no provenance ('setting'; index.js marks them data-setting). A fact worked out by arithmetic,
// a count times a constant included, is computed; the rest is read off the run (measured).
const COMPUTED_FACTS = new Set(['bytes-per-token', 'prefill-tps', 'decode-tps', 'decode-steps', 'cache-bytes', 'weights-what',
  'cache-check', 'cache-reserved']);
const SETTING_FACTS = new Set(['model-name', 'messages', 'vocab', 'max-new', 'context-window', 'layers',
  'kv-heads', 'head-dim', 'bytes-per-element']);
export function factProvenance(name, run) {
  if (SETTING_FACTS.has(name)) return 'setting';
  if (!run.measured) return 'schematic';
  return COMPUTED_FACTS.has(name) ? 'computed' : 'measured';
}

// What the paged pool held against what the positions need, and whether that can be right: the pool's
// blocks held × its bytes per block (measured by the engine, from the pool) must hold the formula's bytes,
// with less than one block to spare. null when the run's events carry no block figures.
export function cacheCheck(cache, bytesPerToken, blockSize = 16) {
  if (!cache || !Number.isFinite(cache.reserved) || !Number.isFinite(cache.blocks) || !(cache.blocks > 0)) return null;
  const needed = cache.tokens * bytesPerToken;
  const perBlock = cache.reserved / cache.blocks;
  const holds = cache.reserved >= needed && cache.reserved - needed < perBlock;
  const rows = perBlock / bytesPerToken;
  return { needed, perBlock, holds, rows: Number.isInteger(rows) ? rows : blockSize };
}

const ROLE_WORDS = { system: 'system instruction', user: 'user message', assistant: 'earlier answer', retrieved: 'retrieved passage' };

// "a system instruction, one earlier exchange, …": the messages of the run on display, in words.
export function messageSummary(messages) {
  if (!messages.length) return 'no messages';
  const lastUser = messages.map((x) => x.role).lastIndexOf('user');
  const counts = new Map();
  messages.forEach((x, i) => {
    const word = i === lastUser ? 'the new question' : (ROLE_WORDS[x.role] || `${x.role} message`);
    counts.set(word, (counts.get(word) || 0) + 1);
  });
  return [...counts].map(([w, n]) => (n === 1 ? w : `${n} × ${w}`)).join(', ');
}

function queueSentence(q) {
  if (!q || q.ahead === null || q.ahead === undefined) return 'no queue position was recorded';
  const ahead = q.firstAhead ?? q.ahead;
  if (ahead === 0) return 'nothing was ahead';
  return `${formatInt(ahead)} ${ahead === 1 ? 'request was' : 'requests were'} ahead`;
}

function decodingSentence(request) {
  const s = (request && request.sampling) || null;
  if (!s) return 'The recorded request does not say how it chose tokens; greedy decoding would take the best one';
  if (!s.temperature) return 'Greedy decoding, which this run uses, takes the best one';
  return `This run sampled (temperature ${s.temperature}): it drew one at random, weighted by those scores,`
    + ' instead of always taking the best';
}

// Facts the story prose shows (keys are the template's data-fact names), from the run on display.
export function storyFacts(run) {
  const m = run.model;
  const steps = run.tokens.slice(1).map((t) => t.stepMs);
  const metrics = run.end && run.end.metrics ? run.end.metrics : {};
  const sw = run.splitWord;
  return {
    'model-name': m.name || MISSING,
    'device': m.device_name || m.device || MISSING,
    'messages': formatInt(run.messages.length),
    'message-kinds': messageSummary(run.messages),
    'queue-ahead': queueSentence(run.queue),
    'decoding': decodingSentence(run.request),
    'prompt-total': formatInt(run.prompt.counts.total ?? run.prompt.tokens.length),
    'content-tokens': formatInt(run.prompt.counts.content),
    'template-tokens': formatInt(run.prompt.counts.template),
    'split-word': sw ? sw.word : MISSING,
    'split-pieces': sw ? sw.pieces.map((p) => JSON.stringify(p)).join(' + ') : MISSING,
    'queue-wait': formatMs(run.queue.waitMs),
    'prefill-ms': formatMs(run.prefill.ms),
    'prefill-tps': formatInt(run.prefill.tokensPerS),
    'ttft': formatMs(metrics.ttft_ms ?? (run.tokens[0] ? run.tokens[0].tMs : null)),
    'first-token': run.firstToken ? JSON.stringify(run.firstToken.text) : MISSING,
    'generated': formatInt(run.tokens.length),
    'decode-steps': formatInt(Math.max(0, run.tokens.length - 1)),
    'pending': formatInt(run.pendingCount),
    'vocab': formatInt(m.vocab_size),
    'max-new': formatInt(run.maxNewTokens),
    'context-window': formatInt(m.context_window),
    'step-median': formatMs(median(steps)),
    // computed from the run's token stamps by the one definition, (n − 1) / (t_last − t_first)
    'decode-tps': formatFixed(decodeTokensPerS(run.tokens.map((t) => t.tMs / 1000)), 1),
    'cache-positions': formatInt(run.cache.tokens),
    'cache-bytes': formatSize(run.cache.bytes),
    'cache-blocks': formatInt(run.cache.blocks),
    'cache-reserved': formatSize(run.cache.reserved),
    'cache-check': cacheCheckText(cacheCheck(run.cache, m.kv_bytes_per_token)),
    'bytes-per-token': formatInt(m.kv_bytes_per_token),
    'layers': formatInt(m.layers),
    'kv-heads': formatInt(m.kv_heads),
    'head-dim': formatInt(m.head_dim),
    'bytes-per-element': formatInt(m.bytes_per_element),
    'weights': formatSize(m.weights_bytes),
    'weights-what': weightsWhat(m),
    'finish-reason': run.end ? run.end.reason : MISSING,
    'e2e': formatMs(metrics.e2e_ms ?? (run.end ? run.end.tMs : null)),
  };
}

// What the weights' byte count holds, where it is more than the model's own weights: on the int4 route
// with float32 copies kept for prompts (cost_shape.float_prefill), the copies and the head's int8 pass too.
export function weightsWhat(model) {
  const shape = model && model.cost_shape;
  if (!shape || !shape.float_prefill) return '';
  return ` (the ${shape.route} layers, the head's int8 copy and the float32 copies kept for prompts of 16 tokens or`
    + ' more: more than the float32 model\'s own weights)';
}

function cacheCheckText(check) {
  if (!check) return MISSING;
  return check.holds
    ? `enough for its positions with less than one block to spare (${formatSize(check.needed)} needed)`
    : `not what its positions need (${formatSize(check.needed)}): the pool's accounting is off`;
}

// The figure's caption lines for a state: [{text, tag}] where tag is a provenance label (or null).
export function readout(state, run) {
  const m = run.measured ? 'measured' : 'schematic';
  const f = storyFacts(run);
  const line = (text, tag = m) => [{ text, tag }];
  const { queue: q, prefill: p } = state;
  const lines = {
    input: () => line(`${run.messages.length} messages: ${state.messages.items.map((x) => x.label).join(' · ')}`),
    template: () => line(`${f['prompt-total']} tokens = ${f['content-tokens']} of content + ${f['template-tokens']} `
      + 'added by the template'),
    tokens: () => (run.splitWord
      ? line(`“${f['split-word']}” is ${run.splitWord.pieces.length} tokens: ${f['split-pieces']}`)
      : line(`${f['prompt-total']} tokens`)),
    queue: () => (q.state === 'empty' ? line('not queued', null)
      : line(`position ${q.position}, ${q.ahead} ahead${q.waitMs === null ? '' : ` · waited ${f['queue-wait']}`}`)),
    prefill: () => {
      if (p.state === 'done') return [...line(`${f['prompt-total']} positions in one pass · ${f['prefill-ms']}`), ...line(`${f['prefill-tps']} tokens/s`, run.measured ? 'computed' : m)];
      return line(p.state === 'running' ? 'prefill running…' : 'prefill has not started', null);
    },
    'first-token': () => (run.firstToken
      ? line(`first token ${f['first-token']} (p = ${run.firstToken.prob.toFixed(2)}) · after ${f.ttft}`)
      : line('no token yet', null)),
    decode: () => [...line(`${f['decode-steps']} decode steps after the first token · median ${f['step-median']}`), ...line(`${f['decode-tps']} tokens/s`, run.measured ? 'computed' : m)],
    cache: () => [
      ...line(`${f['cache-positions']} positions cached in ${f['cache-blocks']} blocks`),
      // the blocks times the pool's bytes per block: worked out, as the story text tags it
      ...line(`${f['cache-reserved']} reserved`, run.measured ? 'computed' : m),
      ...line(`${f['bytes-per-token']} B per token = 2 × ${f.layers} layers × ${f['kv-heads']} KV heads × `
        + `${f['head-dim']} × ${f['bytes-per-element']} B`, 'computed'),
      ...line(`weights ${f.weights}, fixed`),
    ],
    delivery: () => line(`${f.generated} tokens → ${run.text.length} characters · ${run.pendingCount} held back mid-character`),
    end: () => (run.end ? line(endSentence(run.end)) : line('still running…', null)),
    map: () => line(`queue ${f['queue-wait']} | prefill ${f['prefill-ms']} | decode ${f['decode-steps']} steps`
      + ` · total ${f.e2e}`),
  };
  return lines[state.name]();
}

// A stand-in run when no trace could be loaded: shapes only, no numbers (shown as schematic).
export function schematicRun() {
  const roles = ['system', 'user', 'assistant', 'retrieved', 'user'];
  const tokens = [];
  roles.forEach((role, message) => {
    tokens.push({ id: 0, text: '', source: 'marker', message: null });
    for (let k = 0; k < 6; k += 1) tokens.push({ id: 0, text: '', source: role, message });
  });
  const out = Array.from({ length: 12 }, (_, k) => ({ index: k, id: 0, text: '▪', pending: false, stepMs: null,
    tMs: null, cacheTokens: tokens.length + k, cacheBytes: null, cacheBytesFormula: null, prob: null }));
  return {
    measured: false, note: 'No trace loaded: schematic shapes only.', recordedAt: null, model: {}, request: {},
    messages: roles.map((role, index) => ({ index, role, content: '', tokens: 6 })),
    prompt: { rendered: '', tokens, counts: { total: tokens.length }, budget: null },
    splitWord: null, accepted: null,
    queue: { entered: true, position: 1, ahead: 0, firstPosition: 1, firstAhead: 0, fromMs: null, toMs: null, waitMs: null },
    prefill: { started: true, done: true, tokens: tokens.length, ms: null, tokensPerS: null, startMs: null, endMs: null,
      chunks: [], cacheTokens: tokens.length, cacheBytes: null },
    firstToken: null, tokens: out, text: '', pendingCount: 0,
    cache: { tokens: tokens.length + 11, bytes: null, bytesFormula: null }, maxNewTokens: 16,
    end: { type: 'finished', reason: 'eos', cause: null, state: null, complete: true, text: '', tokens: 12, message: null, metrics: null, tMs: null },
    timeline: { segments: [], start: 0, end: 0, totalMs: 0 }, phase: 'end',
  };
}
