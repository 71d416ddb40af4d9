// The kvscope trace format (docs/trace-format.md): build, validate and parse a run's record, and
// derive from its events what the walkthrough's stages show. Pure: no DOM, no network.
import { EVENT, EVENT_FIELDS as PROTOCOL_FIELDS, isTerminal } from './shared/protocol.js';

export const FORMAT = 'kvscope-trace';
export const VERSION = 1;
export const MAX_EVENTS = 20000;

const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
const isInt = (v) => Number.isInteger(v);
const isStr = (v) => typeof v === 'string';
const isBool = (v) => typeof v === 'boolean';
const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const isArr = Array.isArray;
const CHECK = { int: isInt, num: isNum, str: isStr, bool: isBool, obj: isObj, arr: isArr };

// A checker for a protocol kind; "str?" accepts null or absence too.
function checker(kind) {
  if (!kind.endsWith('?')) return CHECK[kind];
  const ok = CHECK[kind.slice(0, -1)];
  const optional = (v) => v == null || ok(v);
  optional.optional = true;
  return optional;
}

// Fields every event of a type must carry, with the checks the walkthrough relies on: the
// protocol's own list (shared/protocol.js, kept equal to model_runner/protocol/events.py by a test).
export const EVENT_FIELDS = Object.fromEntries(Object.entries(PROTOCOL_FIELDS).map(([type, fields]) => [
  type, Object.fromEntries(Object.entries(fields).map(([name, kind]) => [name, checker(kind)])),
]));

const MODEL_FIELDS = { name: isStr, layers: isInt, kv_heads: isInt, head_dim: isInt, bytes_per_element: isNum,
  context_window: isInt, kv_bytes_per_token: isInt };
const TOKEN_FIELDS = { id: isInt, text: isStr, source: isStr };

export class TraceError extends Error {
  constructor(problems) {
    super(`Not a usable kvscope trace: ${problems.slice(0, 3).join('; ')}${problems.length > 3 ? ' …' : ''}`);
    this.name = 'TraceError';
    this.problems = problems;
  }
}

// A trace from its parts; `events` in arrival order (a live run may still be missing its terminal event).
export function makeTrace({ model, request, prompt, events = [], recordedAt = new Date().toISOString(), note } = {}) {
  const trace = { format: FORMAT, version: VERSION, recorded_at: recordedAt, model, request, prompt, events };
  if (note) trace.note = note;
  return trace;
}

export function serializeTrace(trace) {
  return JSON.stringify(trace, null, 1);
}

function checkFields(obj, fields, where, problems) {
  for (const [name, ok] of Object.entries(fields)) {
    if (!(name in obj)) { if (!ok.optional) problems.push(`${where} lacks \`${name}\``); }
    else if (!ok(obj[name])) problems.push(`${where}.${name} has the wrong type`);
  }
}

function validateEvents(events, complete, problems) {
  let lastT = -Infinity;
  let nextIndex = 0;
  events.forEach((ev, i) => {
    const where = `events[${i}]`;
    if (!isObj(ev)) { problems.push(`${where} is not an object`); return; }
    // Own keys only: a `type` of "constructor" must not find Object's.
    const fields = Object.hasOwn(EVENT_FIELDS, ev.type) ? EVENT_FIELDS[ev.type] : null;
    if (!fields) { problems.push(`${where}.type ${JSON.stringify(ev.type)} is not a protocol event`); return; }
    if (!isNum(ev.t_ms)) problems.push(`${where}.t_ms must be a number`);
    else if (ev.t_ms < lastT) problems.push(`${where}.t_ms goes back in time`);
    else lastT = ev.t_ms;
    checkFields(ev, fields, where, problems);
    if (ev.type === EVENT.TOKEN && isInt(ev.index)) {
      if (ev.index !== nextIndex) problems.push(`${where} is token ${ev.index}, expected ${nextIndex}`);
      nextIndex = ev.index + 1;
    }
    if (isTerminal(ev.type) && i !== events.length - 1) problems.push(`${where} is terminal but not the last event`);
  });
  const last = events[events.length - 1];
  if (complete && !(last && isTerminal(last.type))) problems.push('the events do not end with a terminal event');
}

// Every problem found, as short sentences; [] means the trace is usable. `complete: false` accepts a
// run still in progress (no terminal event yet).
export function validateTrace(trace, { complete = true } = {}) {
  const problems = [];
  if (!isObj(trace)) return ['the trace is not a JSON object'];
  if (trace.format !== FORMAT) problems.push(`\`format\` must be "${FORMAT}"`);
  if (trace.version !== VERSION) problems.push(`\`version\` must be ${VERSION}, got ${JSON.stringify(trace.version)}`);
  if (!isObj(trace.model)) problems.push('`model` must be an object of model facts');
  else checkFields(trace.model, MODEL_FIELDS, 'model', problems);
  if (!isObj(trace.request) || !isArr(trace.request.messages)) problems.push('`request.messages` must be a list');
  // A run exported before its prompt preview arrived has no prompt: the figure then shows no token pieces.
  const prompt = trace.prompt ?? null;
  if (prompt !== null && (!isObj(prompt) || !isArr(prompt.tokens))) problems.push('`prompt.tokens` must be a list');
  else if (prompt !== null) {
    prompt.tokens.forEach((t, i) => {
      if (isObj(t)) checkFields(t, TOKEN_FIELDS, `prompt.tokens[${i}]`, problems);
      else problems.push(`prompt.tokens[${i}] is not an object`);
    });
  }
  if (!isArr(trace.events)) problems.push('`events` must be a list');
  else if (trace.events.length > MAX_EVENTS) problems.push(`\`events\` holds more than ${MAX_EVENTS} events`);
  else validateEvents(trace.events, complete, problems);
  return problems;
}

// A trace from JSON text or an object; throws TraceError listing what is wrong.
export function parseTrace(input, options) {
  let trace = input;
  if (typeof input === 'string') {
    try { trace = JSON.parse(input); } catch (err) { throw new TraceError([`not JSON (${err.message})`]); }
  }
  const problems = validateTrace(trace, options);
  if (problems.length) throw new TraceError(problems);
  return trace;
}

// ---- derived data -------------------------------------------------------------------------------

// The word of the prompt cut into the most tokens (a word can be several tokens), preferring the
// last user message. Pieces: consecutive content tokens of one message, each after the first
// starting without whitespace.
export function splitWord(tokens) {
  let best = null;
  let run = [];
  const close = () => {
    const word = run.map((t) => t.text).join('').trim();
    if (run.length > 1 && /[A-Za-z]/.test(word)) {
      const cand = { word, pieces: run.map((t) => t.text), positions: run.map((t) => t.pos), message: run[0].message };
      const better = !best || cand.pieces.length > best.pieces.length
        || (cand.pieces.length === best.pieces.length && cand.message > best.message);
      if (better) best = cand;
    }
    run = [];
  };
  tokens.forEach((t, pos) => {
    const content = t.source !== 'marker' && t.source !== 'inserted';
    const wordish = content && /[A-Za-z0-9]/.test(t.text) && !/\s$/.test(t.text);
    const joins = wordish && run.length > 0 && run[0].message === t.message && /^[A-Za-z0-9]/.test(t.text);
    if (!joins) close();
    if (wordish) run.push({ ...t, pos });
  });
  close();
  return best;
}

function queueOf(events) {
  const queued = events.filter((e) => e.type === EVENT.QUEUED);
  const start = events.find((e) => e.type === EVENT.PREFILL_START);
  const from = queued.length ? queued[0].t_ms : null;
  return {
    entered: queued.length > 0,
    position: queued.length ? queued[queued.length - 1].position : null,
    ahead: queued.length ? queued[queued.length - 1].ahead : null,
    firstPosition: queued.length ? queued[0].position : null,
    firstAhead: queued.length ? queued[0].ahead : null,
    fromMs: from,
    toMs: start ? start.t_ms : null,
    // The server's own stamps: t_ms counts from submit, so prefill_start.t_ms is the queue time the
    // server reports (metrics.queue_ms), and queue + prefill tiles TTFT.
    waitMs: start ? start.t_ms : null,
  };
}

function prefillOf(events) {
  const start = events.find((e) => e.type === EVENT.PREFILL_START);
  const end = events.find((e) => e.type === EVENT.PREFILL_END);
  return {
    started: !!start,
    done: !!end,
    tokens: end ? end.tokens : start ? start.prompt_tokens : null,
    ms: end ? end.ms : null,
    tokensPerS: end ? end.tokens_per_s : null,
    startMs: start ? start.t_ms : null,
    endMs: end ? end.t_ms : null,
    chunks: events.filter((e) => e.type === EVENT.PREFILL_CHUNK).map((e) => ({ start: e.start, end: e.end, ms: e.ms })),
    cacheTokens: end ? end.cache_tokens : 0,
    cacheBytes: end ? end.cache_bytes_measured : 0,
  };
}

function endOf(events) {
  const last = events[events.length - 1];
  if (!last || !isTerminal(last.type)) return null;
  return {
    type: last.type,
    reason: last.type === EVENT.ERROR ? last.code : last.reason,
    cause: last.cause || null,
    state: last.state || null,
    complete: last.type === EVENT.FINISHED,
    text: last.text ?? '',
    tokens: last.tokens ?? 0,
    message: last.message || null,
    metrics: last.metrics || null,
    tMs: last.t_ms,
  };
}

const PHASE_BY_EVENT = {
  [EVENT.ACCEPTED]: 'queued', [EVENT.QUEUED]: 'queued', [EVENT.PREFILL_START]: 'prefill', [EVENT.PREFILL_CHUNK]: 'prefill',
  [EVENT.PREFILL_END]: 'first-token', [EVENT.TOKEN]: 'decode',
  [EVENT.FINISHED]: 'end', [EVENT.CANCELLED]: 'end', [EVENT.ERROR]: 'end',
};

// The phase of the last event that moves a run on; `attention`, `preempted` and `resumed` do not.
function phaseOf(events) {
  for (let i = events.length - 1; i >= 0; i -= 1) {
    const phase = PHASE_BY_EVENT[events[i].type];
    if (phase) return phase;
  }
  return 'submitted';
}

// The timeline strip on one axis of real milliseconds: queue, prefill, then one segment per decode step.
function timelineOf(q, p, tokens) {
  const segments = [];
  // The queue runs from submit (t = 0 on the server's clock) to prefill start: the server's queue_ms.
  if (q.toMs !== null) segments.push({ kind: 'queue', from: 0, to: q.toMs, ms: q.toMs });
  if (p.startMs !== null && p.endMs !== null) segments.push({ kind: 'prefill', from: p.startMs, to: p.endMs, ms: p.endMs - p.startMs });
  tokens.forEach((t, i) => {
    if (i === 0) return; // token 0 comes from the prefill logits: it has no step of its own
    const from = tokens[i - 1].tMs;
    segments.push({ kind: 'decode', index: t.index, from, to: t.tMs, ms: t.tMs - from, stepMs: t.stepMs });
  });
  const start = segments.length ? segments[0].from : 0;
  const end = segments.length ? segments[segments.length - 1].to : 0;
  return { segments, start, end, totalMs: end - start };
}

// Everything the walkthrough shows, derived from the trace's events so far (pure; recomputed, never patched).
export function deriveRun(trace) {
  const events = trace.events || [];
  const promptTokens = (trace.prompt && trace.prompt.tokens) || [];
  const messages = ((trace.request && trace.request.messages) || []).map((m, i) => ({
    index: i, role: m.role, content: m.content, tokens: promptTokens.filter((t) => t.message === i).length,
  }));
  const tokens = events.filter((e) => e.type === EVENT.TOKEN).map((e) => ({
    index: e.index, id: e.id, text: e.text, pending: e.pending, stepMs: e.step_ms, tMs: e.t_ms,
    cacheTokens: e.cache_tokens, cacheBytes: e.cache_bytes_measured, cacheBytesFormula: e.cache_bytes_formula, prob: e.prob,
    kvBlocks: e.kv_blocks, kvBytesReserved: e.kv_bytes_reserved,
  }));
  const accepted = events.find((e) => e.type === EVENT.ACCEPTED) || null;
  const queue = queueOf(events);
  const prefill = prefillOf(events);
  const endEv = events.find((e) => e.type === EVENT.PREFILL_END);
  const lastTok = tokens[tokens.length - 1];
  const last = events[events.length - 1];
  return {
    measured: !trace.synthetic,
    note: trace.note || null,
    recordedAt: trace.recorded_at || null,
    recordedOn: trace.recorded_on || null,
    model: trace.model || {},
    request: trace.request || {},
    messages,
    prompt: {
      rendered: (trace.prompt && trace.prompt.rendered) || '',
      tokens: promptTokens,
      counts: (trace.prompt && trace.prompt.counts) || { total: promptTokens.length },
      budget: (accepted && accepted.budget) || (trace.prompt && trace.prompt.budget) || null,
    },
    splitWord: splitWord(promptTokens),
    accepted,
    queue,
    prefill,
    firstToken: endEv ? endEv.first_token : null,
    tokens,
    text: tokens.map((t) => t.text).join(''),
    pendingCount: tokens.filter((t) => t.pending).length,
    cache: lastTok
      ? { tokens: lastTok.cacheTokens, bytes: lastTok.cacheBytes, bytesFormula: lastTok.cacheBytesFormula,
        blocks: lastTok.kvBlocks, reserved: lastTok.kvBytesReserved }
      : { tokens: prefill.cacheTokens, bytes: prefill.cacheBytes, bytesFormula: endEv ? endEv.cache_bytes_formula : 0 },
    // the run kept its attention weights (docs/protocol.md "inspect"): its decode steps pay for that
    inspected: Boolean(trace.request && trace.request.inspect && trace.request.inspect.attention),
    maxNewTokens: accepted ? accepted.max_new_tokens : (trace.request && trace.request.max_new_tokens) || 0,
    end: endOf(events),
    timeline: timelineOf(queue, prefill, tokens),
    phase: phaseOf(events),
  };
}
