// The four one-click experiments as data (no DOM): the requests each one sends (`title` names
// them in the history), and the analysis that turns its finished runs into chart series and table
// rows. Sizes are kept small so each experiment takes seconds, not minutes, on a 2-core CPU with
// the default model.
import { EVENT } from '../shared/protocol.js';
import { median, robustSlope, prefillFlopsPerS, decodeBytesPerS, decodeFlopsPerS } from './metrics.js';

const GREEDY = { temperature: 0, top_k: null, top_p: 1.0, seed: null };
const BASE = { sampling: GREEDY, stop: [], delivery: 'stream', kv_cache: true, prefill_chunk: 0, overflow: 'reject' };
// A short system prompt replaces the template's longer default one: the cache-off steps then start
// from a small sequence and their growth with position stands out.
const COUNTING = [{ role: 'system', content: 'You count.' },
                  { role: 'user', content: 'Count from 1 to 100, separated by commas.' }];

// Written for this page: a neutral passage to lengthen prompts.
const FILLER = 'The harbour town wakes early. Fishing boats leave before sunrise, the bakery opens at six, '
  + 'and by eight the market square is full of crates of fruit, nets drying in the wind and children '
  + 'walking to school along the sea wall. ';

export const SWEEP_REPEATS = [0, 2, 4, 8, 16];
// Prompt lengths for the cache experiment, in passages, in an order that is not the sorted one so
// that a drift in machine load does not line up with position.
export const KV_REPEATS = [0, 6, 2, 4];

function request(messages, extra) { return { ...BASE, messages, ...extra }; }

export const EXPERIMENTS = {
  // Four prompt lengths, a few steps each, cache on then off at each length. A step's position is
  // the sequence length it works on, so the four runs spread the steps from about 30 to 300
  // positions: enough for the cost of recomputing everything to stand out from the fixed cost of a
  // step, in seconds rather than the minutes one long cache-off answer would take.
  kv: {
    title: 'KV on/off',
    plan: () => KV_REPEATS.flatMap((n) => [true, false].map((on) => ({
      label: `cache ${on ? 'on' : 'off'}, ${n} × passage`,
      series: `cache ${on ? 'on' : 'off'}`,
      payload: request([
        COUNTING[0],
        ...(n ? [{ role: 'retrieved', content: FILLER.repeat(n) }] : []),
        COUNTING[1],
      ], { max_new_tokens: 8, kv_cache: on }),
    }))),
  },
  delivery: {
    title: 'delivery',
    plan: () => ['stream', 'buffered'].map((delivery) => ({
      label: delivery,
      payload: request([{ role: 'user', content: 'Describe a harbour town at dawn in three sentences.' }],
        { max_new_tokens: 24, delivery }),
    })),
  },
  sweep: {
    title: 'sweep',
    plan: () => SWEEP_REPEATS.map((n) => ({
      label: `${n} × passage`,
      payload: request([
        ...(n ? [{ role: 'retrieved', content: FILLER.repeat(n) }] : []),
        { role: 'user', content: 'Say one word about the town.' },
      ], { max_new_tokens: 8 }),
    })),
  },
  concurrent: {
    title: 'two at once',
    // B is sent the moment the server has accepted A, so A is running when B arrives.
    staggered: true,
    plan: () => [
      { label: 'A', payload: request(COUNTING, { max_new_tokens: 24 }) },
      { label: 'B', payload: request([{ role: 'user', content: 'Name one colour.' }], { max_new_tokens: 8 }) },
    ],
  },
};

// A run gives an experiment whole data only if it ended on its own terms: a timeout or a
// cancellation leaves a series cut short.
export function completed(run) {
  return run.status === 'finished' && ['eos', 'max_tokens', 'stop_string'].includes(run.terminal.reason);
}

const tokenEvents = (run) => run.events.filter((e) => e.type === EVENT.TOKEN);
const eventOf = (run, type) => run.events.find((e) => e.type === type);
// Browser receipt time of a run's first event of `type`, relative to `origin`.
function receivedAt(run, type, origin) {
  const i = run.events.findIndex((e) => e.type === type);
  return i < 0 ? null : run.received[i] - origin;
}

// Decode step time against the sequence length the step worked on (prompt + tokens so far), one
// series per `series` name. Besides a robust slope, `fastest` compares the quickest step of the
// shortest prompt's run with that of the longest: the steps least disturbed by anything else on
// the machine, so the plainest view of the trend.
export function analyseKv(results) {
  const groups = new Map();
  for (const { series: name, run } of results) {
    const prompt = eventOf(run, EVENT.ACCEPTED)?.prompt_tokens ?? 0;
    // Token 0 comes from the prefill: it has no step of its own.
    const points = tokenEvents(run).filter((e) => e.index > 0).map((e) => ({ x: prompt + e.index, y: e.step_ms }));
    if (!groups.has(name)) groups.set(name, []);
    groups.get(name).push({ prompt, points });
  }
  const series = [...groups].map(([name, runs]) => ({
    // Points only: the steps come in four clusters of positions, and a line would zigzag inside them.
    name, style: 'points', points: runs.flatMap((r) => r.points).sort((a, b) => a.x - b.x),
  }));
  const stat = (fn) => Object.fromEntries(series.map((s) => [s.name, fn(s.points)]));
  return {
    series,
    slopes: stat(robustSlope),
    medians: stat((pts) => median(pts.map((p) => p.y))),
    fastest: Object.fromEntries([...groups].map(([name, runs]) => [name, fastestShortLong(runs)])),
  };
}

function fastestShortLong(runs) {
  const withSteps = runs.filter((r) => r.points.length).sort((a, b) => a.prompt - b.prompt);
  const fastest = (r) => (r ? { at: r.points[0].x, ms: Math.min(...r.points.map((p) => p.y)) } : null);
  return { short: fastest(withSteps[0]), long: fastest(withSteps[withSteps.length - 1]) };
}

// Browser-side: when the first visible text arrived and when the answer ended, from the send.
export function analyseDelivery(results) {
  const rows = results.map(({ label, run }) => {
    const firstText = run.firstTextAt == null ? null : run.firstTextAt - run.sentAt;
    const total = run.terminalAt == null ? null : run.terminalAt - run.sentAt;
    const metrics = run.terminal?.metrics || {};
    return { label, firstText, total, serverFirstText: metrics.first_text_ms ?? null, serverE2e: metrics.e2e_ms ?? null,
             sameEvent: run.firstTextAt != null && run.firstTextAt === run.terminalAt };
  });
  const lanes = rows.map((r) => ({
    name: r.label,
    segments: [
      { from: 0, to: r.firstText ?? r.total ?? 0, kind: 'waiting' },
      ...(r.firstText != null && r.total > r.firstText ? [{ from: r.firstText, to: r.total, kind: 'receiving' }] : []),
    ],
    marks: r.firstText != null ? [{ at: r.firstText, label: 'first visible text' }] : [],
  }));
  return { rows, lanes };
}

// TTFT and prefill time against prompt tokens, with throughput estimates from the model's facts.
// What the sweep's own numbers say, not a fixed verdict: did prefill's achieved FLOP/s still climb with
// prompt length (too short to fill the arithmetic units), and how far below it did decode stay?
// rows: analyseSweep's rows. Returns { prefillGrowth, tailGrowth, decodeRatio, prefill, decode } with
// prefill one of 'climbing' | 'rose-then-level' | 'level' and decode 'memory' | 'unclear' (null when the
// sweep has too little).
export function sweepVerdict(rows) {
  const ok = rows.filter((r) => r.prefillFlopsPerS > 0).sort((a, b) => a.promptTokens - b.promptTokens);
  if (!ok.length) return null;
  const first = ok[0];
  const last = ok[ok.length - 1];
  const prefillGrowth = ok.length > 1 ? last.prefillFlopsPerS / first.prefillFlopsPerS : null;
  // Still climbing at the end (the last step up > 15 %), or rose and then levelled off, or flat throughout.
  const tailGrowth = ok.length > 1 ? last.prefillFlopsPerS / ok[ok.length - 2].prefillFlopsPerS : null;
  let prefill = null;
  if (tailGrowth !== null) prefill = tailGrowth > 1.15 ? 'climbing' : (prefillGrowth > 1.25 ? 'rose-then-level' : 'level');
  const decodeRatio = last.decodeFlopsPerS > 0 ? last.prefillFlopsPerS / last.decodeFlopsPerS : null;
  return {
    first, last, prefillGrowth, tailGrowth, decodeRatio, prefill,
    // A lower FLOP rate than prefill's says decode did less arithmetic a second, not what held it back: that
    // needs its bytes against the machine's copy bandwidth, which a sweep does not measure.
    decode: decodeRatio === null ? null : (decodeRatio >= 2 ? 'slower' : 'unclear'),
  };
}

export function analyseSweep(results, facts) {
  const rows = results.map(({ label, run }) => {
    const promptTokens = eventOf(run, EVENT.ACCEPTED)?.prompt_tokens ?? null;
    const prefill = eventOf(run, EVENT.PREFILL_END);
    const ttft = tokenEvents(run)[0]?.t_ms ?? null;
    const steps = tokenEvents(run).filter((e) => e.index > 0);
    const stepMs = median(steps.map((e) => e.step_ms));
    const bandwidth = median(steps.map((e) => decodeBytesPerS(facts, e.cache_tokens - 1, e.step_ms)));
    return {
      label, promptTokens, ttftMs: ttft, prefillMs: prefill?.ms ?? null, stepMs,
      prefillFlopsPerS: prefillFlopsPerS(facts, promptTokens, prefill?.ms),
      decodeBytesPerS: bandwidth,
      decodeFlopsPerS: median(steps.map((e) => decodeFlopsPerS(facts, e.cache_tokens - 1, e.step_ms))),
    };
  });
  const ok = rows.filter((r) => r.promptTokens != null && r.ttftMs != null);
  return {
    rows,
    ttftSeries: [{ name: 'TTFT', points: ok.map((r) => ({ x: r.promptTokens, y: r.ttftMs })) },
                 // Hollow: with no queue, TTFT and prefill time nearly coincide, and both must show.
                 { name: 'prefill time', points: ok.map((r) => ({ x: r.promptTokens, y: r.prefillMs })), hollow: true }],
    flopsSeries: [{ name: 'prefill (est.)', points: ok.filter((r) => r.prefillFlopsPerS).map((r) => ({ x: r.promptTokens, y: r.prefillFlopsPerS / 1e9 })) },
                  { name: 'decode (est.)', points: ok.filter((r) => r.decodeFlopsPerS).map((r) => ({ x: r.promptTokens, y: r.decodeFlopsPerS / 1e9 })) }],
  };
}

// Lanes on one browser clock: waiting (sent → prefill starts), prefill, decode.
export function analyseConcurrent(results) {
  const origin = Math.min(...results.map(({ run }) => run.sentAt));
  const lanes = results.map(({ label, run }) => {
    const sent = run.sentAt - origin;
    const start = receivedAt(run, EVENT.PREFILL_START, origin);
    const end = receivedAt(run, EVENT.PREFILL_END, origin);
    const stop = run.terminalAt == null ? null : run.terminalAt - origin;
    const segments = [];
    if (start != null) segments.push({ from: sent, to: start, kind: 'queue' });
    if (start != null && end != null) segments.push({ from: start, to: end, kind: 'prefill' });
    if (end != null && stop != null) segments.push({ from: end, to: stop, kind: 'decode' });
    return { name: label, segments, marks: [] };
  });
  const rows = results.map(({ label, run }) => ({
    label,
    maxAhead: Math.max(0, ...run.queuedSeen.map((q) => q.ahead)),
    positions: run.queuedSeen.map((q) => q.position),
    queueMs: eventOf(run, EVENT.PREFILL_START)?.t_ms ?? null,
    // Decode steps whose forward pass also computed another request's token (batch_size > 1).
    sharedSteps: tokenEvents(run).filter((e) => e.index > 0 && e.batch_size > 1).length,
    maxBatch: Math.max(1, ...tokenEvents(run).map((e) => e.batch_size)),
    status: run.status,
  }));
  return { lanes, rows };
}
