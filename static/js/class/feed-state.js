// The class view's state, built from the engine feed and the class messages alone: applyEvent(state,
// event) is a pure reducer (no DOM, no clock, no I/O; the same events always give the same state),
// so the projector shows what the engine reported and a test can check it with a fixed event list.
import { isTerminal } from '../shared/protocol.js';

export const HISTORY_STEPS = 48; // engine steps the batch grid keeps (the newest on the right); the feed
// keeps as many (STEP_HISTORY in model_runner/shared/feed.py) for a view opened late
const PAST = 'past'; // a request seen only in steps from before this page subscribed
export const RECENT_ENDED = 6; // ended requests the lanes keep showing after their end

export function createClassState() {
  return {
    requests: new Map(), // key → request record, in the order the feed first named them
    steps: [], // the last HISTORY_STEPS steps, oldest first
    kv: null, // the pool as the last step or snapshot reported it
    blocks: new Map(), // block id → {owner, shared}: every block a live request holds
    policy: null,
    running: 0, // from the newest of engine_step and class_stats: both are the engine's own counts
    waiting: 0,
    ended: { finished: 0, cancelled: 0, error: 0 }, // endings this page has seen on the feed
    endedSinceStats: { finished: 0, cancelled: 0, error: 0 }, // …since the last class_stats counted them
    stats: null, // the last class_stats: the server's counters and percentiles
    laptops: null,
    settings: null,
    batchInvariant: null, // the engine's batch-invariant mode: {on, claimed, rows, …} or {on: false, why_unavailable}
    modeSwitched: null, // {on}: the mode changed while this page watched (only the teacher's control says so)
    dropped: 0, // feed events lost before reaching this page (from the events' `dropped` fields)
    lastStep: null, // {step, ms, batchTokens, batchSize}
    version: 0, // bumped on every change, so views redraw only when something moved
  };
}

function request(state, key, label) {
  let r = state.requests.get(key);
  if (!r) {
    r = { key, label: label || key, status: 'waiting', promptTokens: null, tokens: 0, blocks: [], shared: [],
      prompt: null, answer: null, reason: null, cause: null, preemptions: 0, endOrder: 0 };
    state.requests.set(key, r);
  } else if (label) {
    r.label = label;
  }
  return r;
}

const isEnded = (r) => isTerminal(r.status);
const isPast = (r) => r.status === PAST;

// The requests the lanes show: every one in flight, then the last few that ended (newest first).
export function lanes(state) {
  const all = [...state.requests.values()];
  const live = all.filter((r) => !isEnded(r) && !isPast(r));
  return [...live, ...recentlyEnded(state)];
}

// The last RECENT_ENDED requests to end, the newest first.
function recentlyEnded(state) {
  return [...state.requests.values()].filter(isEnded).sort((a, b) => b.endOrder - a.endOrder).slice(0, RECENT_ENDED);
}

// The batch grid's rows: the requests named in the kept steps, in first-seen order.
export function gridRows(state) {
  const keys = new Set();
  for (const step of state.steps) for (const key of Object.keys(step.cells)) keys.add(key);
  return [...state.requests.keys()].filter((k) => keys.has(k)).map((k) => state.requests.get(k));
}

// Bytes from block counts: reserved by requests, kept for prefixes, the pool; and `filled`, the part
// of the reserved blocks that holds positions (prompt + tokens decoded so far; a request's last
// block is partly empty), each shared prefix block counted once.
export function kvBytes(state) {
  const kv = state.kv;
  if (!kv) return null;
  const per = kv.bytes_per_block;
  const size = kv.block_size;
  let positions = 0;
  let sharedRefs = 0;
  const shared = new Set();
  for (const r of state.requests.values()) {
    if (!r.blocks.length) continue;
    positions += Math.min(r.blocks.length * size, (r.promptTokens ?? 0) + r.tokens);
    sharedRefs += r.shared.length;
    for (const b of r.shared) shared.add(b);
  }
  positions = Math.max(0, positions - (sharedRefs - shared.size) * size);
  return { used: kv.used * per, cached: (kv.cached || 0) * per, pool: kv.total * per, perBlock: per,
    filled: Math.min(kv.used * per, (positions * per) / size) };
}

function setBlocks(state, r, blocks, shared) {
  for (const b of r.blocks) if (state.blocks.get(b)?.owner === r.key) state.blocks.delete(b);
  r.blocks = blocks;
  r.shared = shared;
  const sharedSet = new Set(shared);
  for (const b of blocks) {
    const prior = state.blocks.get(b);
    // A shared prefix block keeps its first owner's colour; the mark says that others read it too.
    if (!prior || !state.requests.has(prior.owner) || isEnded(state.requests.get(prior.owner))) {
      state.blocks.set(b, { owner: r.key, shared: sharedSet.has(b) });
    } else if (sharedSet.has(b)) {
      prior.shared = true;
    }
  }
}

function freeBlocks(state, r) {
  setBlocks(state, r, [], []);
}

// The pool after `freed` blocks went back. An ending between steps (a cancel, the last request of a
// busy spell) is followed by no step whose count would say so; the next step's count replaces this.
function release(state, freed) {
  const kv = state.kv;
  if (!kv || !(freed > 0)) return;
  const n = Math.min(freed, kv.used);
  const cached = !!state.policy?.prefix_caching; // with prefix caching, freed blocks stay cached
  state.kv = { ...kv, used: kv.used - n, cached: (kv.cached || 0) + (cached ? n : 0), free: kv.free + (cached ? 0 : n) };
}

// Forget ended (and past) requests that neither the lanes nor the grid show any more, so memory stays bounded.
function prune(state) {
  const inGrid = new Set();
  for (const step of state.steps) for (const key of Object.keys(step.cells)) inGrid.add(key);
  const keep = new Set(recentlyEnded(state).map((r) => r.key));
  for (const r of [...state.requests.values()]) {
    if ((isEnded(r) || isPast(r)) && !keep.has(r.key) && !inGrid.has(r.key)) state.requests.delete(r.key);
  }
}

function keepStep(state, e, cells) {
  state.steps.push({ step: e.step, ms: e.ms, batchTokens: e.batch_tokens, batchSize: (e.batch || []).length, cells });
  if (state.steps.length > HISTORY_STEPS) state.steps.splice(0, state.steps.length - HISTORY_STEPS);
  state.lastStep = state.steps[state.steps.length - 1];
}

// A step from before this page subscribed (`history`, sent ahead of the live events): a column of the
// grid only. Its requests may have ended since, unseen, so it moves no lane, block or count (the
// snapshot's are newer); a step the grid already has is skipped.
function onPastStep(state, e) {
  const newest = state.lastStep;
  if (newest && e.step <= newest.step) return;
  const cells = {};
  for (const item of e.batch || []) {
    const known = state.requests.has(item.request);
    const r = request(state, item.request, item.label);
    if (!known) r.status = PAST;
    cells[item.request] = item.kind;
  }
  for (const key of e.preempted || []) if (!(key in cells) && state.requests.has(key)) cells[key] = 'preempted';
  keepStep(state, e, cells);
  prune(state);
}

function onStep(state, e) {
  if (e.history === true) { onPastStep(state, e); return; }
  const cells = {};
  for (const item of e.batch || []) {
    const r = request(state, item.request, item.label);
    cells[item.request] = item.kind;
    if (isEnded(r)) continue; // the step that ended it is published after its end: keep it ended
    r.status = item.kind === 'decode' ? 'decode' : item.kind;
    if (item.kind === 'decode') r.tokens += 1;
    setBlocks(state, r, item.blocks || [], item.shared_blocks || []);
  }
  for (const key of e.preempted || []) {
    const r = state.requests.get(key);
    if (r && !isEnded(r)) { r.status = 'preempted'; freeBlocks(state, r); }
  }
  // Requests in flight but not in this step's forward: waiting, or preempted and waiting to recompute.
  for (const r of state.requests.values()) {
    if (isEnded(r) || r.key in cells) continue;
    if (r.status === 'waiting' || r.status === 'preempted') cells[r.key] = r.status;
  }
  keepStep(state, e, cells);
  if (e.kv) state.kv = e.kv;
  state.waiting = e.waiting ?? state.waiting;
  state.running = e.running ?? state.running;
  prune(state);
}

function withText(r, e) {
  if (typeof e.prompt === 'string') r.prompt = e.prompt;
  if (typeof e.answer === 'string') r.answer = e.answer;
}

const HANDLERS = {
  engine_snapshot(state, e) {
    state.policy = e.policy || state.policy;
    state.kv = e.kv || state.kv;
    state.waiting = e.waiting ?? 0;
    state.running = e.running ?? 0;
  },
  engine_submit(state, e) {
    const r = request(state, e.request, e.label);
    r.promptTokens = e.prompt_tokens ?? r.promptTokens;
    withText(r, e);
  },
  engine_admit(state, e) {
    const r = request(state, e.request, e.label);
    if (isEnded(r)) return;
    r.promptTokens = e.prompt_tokens ?? r.promptTokens;
    r.status = 'prefill';
    withText(r, e);
  },
  engine_step: onStep,
  engine_preempt(state, e) {
    const r = request(state, e.request, e.label);
    if (isEnded(r)) return;
    r.status = 'preempted';
    r.preemptions += 1;
    freeBlocks(state, r);
    release(state, e.blocks_freed);
  },
  engine_end(state, e) {
    const r = request(state, e.request, e.label);
    if (isEnded(r)) return;
    const outcome = isTerminal(e.outcome) ? e.outcome : 'error';
    r.status = outcome;
    r.reason = e.reason ?? null;
    r.cause = e.cause ?? null; // who cancelled it, where the server says so ("teacher")
    if (typeof e.tokens === 'number') r.tokens = e.tokens;
    withText(r, e);
    freeBlocks(state, r);
    release(state, e.blocks_freed);
    state.ended[outcome] += 1;
    state.endedSinceStats[outcome] += 1;
    r.endOrder = state.ended.finished + state.ended.cancelled + state.ended.error;
    prune(state);
  },
  engine_policy(state, e) {
    state.policy = e.policy || state.policy;
  },
  class_state(state, e) {
    state.laptops = e.laptops ?? state.laptops;
    state.settings = e.settings || state.settings;
    const mode = e.batch_invariant;
    if (mode && typeof mode === 'object') {
      const before = state.batchInvariant;
      if (before && !!before.on !== !!mode.on) state.modeSwitched = { on: !!mode.on };
      state.batchInvariant = mode;
    }
  },
  class_stats(state, e) {
    state.stats = e;
    state.endedSinceStats = { finished: 0, cancelled: 0, error: 0 };
    // After lost events a lane may wait for an end that never comes: when the engine says nothing
    // is queued or running, such lanes are gone (a live request reappears with its next step).
    if (state.dropped > 0 && e.waiting === 0 && e.running === 0) {
      for (const r of [...state.requests.values()]) {
        if (!isEnded(r) && !isPast(r)) { freeBlocks(state, r); state.requests.delete(r.key); }
      }
    }
    state.waiting = e.waiting ?? state.waiting;
    state.running = e.running ?? state.running;
  },
};

// The server's count of endings (class_stats, once a second) plus those the feed has brought since,
// so the counters move with the lanes; without class_stats yet, the endings this page has seen.
export function endings(state) {
  const s = state.stats;
  const since = state.endedSinceStats;
  if (!s) return { ...state.ended };
  return { finished: (s.finished ?? 0) + since.finished, cancelled: (s.cancelled ?? 0) + since.cancelled,
    error: (s.errors ?? 0) + since.error };
}

// Applies one event to `state` (changed in place and returned); unknown events change nothing.
export function applyEvent(state, event) {
  if (!event || typeof event !== 'object') return state;
  const handler = HANDLERS[event.type];
  if (typeof event.dropped === 'number') state.dropped += event.dropped;
  if (!handler && typeof event.dropped !== 'number') return state;
  if (handler) handler(state, event);
  state.version += 1;
  return state;
}

// Every event in order, from a fresh state: what a test (or a replay) uses.
export function reduceAll(events) {
  return events.reduce(applyEvent, createClassState());
}
