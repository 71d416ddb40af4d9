// The four one-click experiments as data (no DOM): the requests each one sends (`title` names
// them in the history), and the analysis
// that turns its finished runs into chart series and table rows. Sizes are kept small so each
// experiment takes seconds, not minutes, on a 2-core CPU with the default model.
import { median, robustSlope, prefillFlopsPerS, decodeBytesPerS, decodeFlopsPerS } from './metrics.js';

const GREEDY = { temperature: 0, top_k: null, top_p: 1.0, seed: null };
const BASE = { sampling: GREEDY, stop: [], delivery: 'stream', kv_cache: true, prefill_chunk: 0, overflow: 'reject' };
// A short system prompt replaces the template's longer default one: the cache-off steps then start
// from a small sequence and their growth with position stands out.
const COUNTING = [{ role: 'system', content: 'You count.' },
                  { role: 'user', content: 'Count from 1 to 100, separated by commas.' }];

// Written for this page: a neutral passage to lengthen the prompt in the sweep.
const FILLER = 'The harbour town wakes early. Fishing boats leave before sunrise, the bakery opens at six, '
  + 'and by eight the market square is full of crates of fruit, nets drying in the wind and children '
  + 'walking to school along the sea wall. ';

export const SWEEP_REPEATS = [0, 2, 4, 8, 16];

function request(messages, extra) { return { ...BASE, messages, ...extra }; }

export const EXPERIMENTS = {
  // Two passes each, alternating, so a spell of load from elsewhere on the machine rarely hits
  // the same positions twice; the analysis keeps the faster pass at each position.
  kv: {
    title: 'KV on/off',
    plan: () => [1, 2].flatMap((pass) => [true, false].map((on) => ({
      label: `cache ${on ? 'on' : 'off'}, pass ${pass}`,
      series: `cache ${on ? 'on' : 'off'}`,
      payload: request(COUNTING, { max_new_tokens: 40, kv_cache: on }),
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
    // B is sent the moment the server has accepted A, so B is reliably the one that waits.
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

const tokenEvents = (run) => run.events.filter((e) => e.type === 'token');
const eventOf = (run, type) => run.events.find((e) => e.type === type);
// Browser receipt time of a run's first event of `type`, relative to `origin`.
function receivedAt(run, type, origin) {
  const i = run.events.findIndex((e) => e.type === type);
  return i < 0 ? null : run.received[i] - origin;
}

// Decode step time against the sequence length the step worked on (prompt + tokens so far), one
// series per `series` name, keeping the fastest pass at each position. Besides the robust slope,
// `fastest` gives the quickest step in the first and last quarter of positions: the steps least
// disturbed by anything else on the machine, so the plainest view of the trend.
export function analyseKv(results) {
  const bySeries = new Map();
  for (const { series: name, run } of results) {
    const prompt = eventOf(run, 'accepted')?.prompt_tokens ?? 0;
    const best = bySeries.get(name) || new Map();
    for (const e of tokenEvents(run)) {
      if (e.index === 0) continue; // token 0 comes from the prefill: it has no step of its own
      const x = prompt + e.index;
      best.set(x, Math.min(best.get(x) ?? Infinity, e.step_ms));
    }
    bySeries.set(name, best);
  }
  const series = [...bySeries].map(([name, best]) => ({
    name, style: 'both', points: [...best].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({ x, y })),
  }));
  const stat = (fn) => Object.fromEntries(series.map((s) => [s.name, fn(s.points)]));
  return {
    series,
    slopes: stat(robustSlope),
    medians: stat((pts) => median(pts.map((p) => p.y))),
    fastest: stat(fastestEarlyLate),
  };
}

function fastestEarlyLate(points) {
  const q = Math.max(1, Math.floor(points.length / 4));
  const min = (pts) => (pts.length ? Math.min(...pts.map((p) => p.y)) : null);
  return { early: min(points.slice(0, q)), late: min(points.slice(-q)) };
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
export function analyseSweep(results, facts) {
  const rows = results.map(({ label, run }) => {
    const promptTokens = eventOf(run, 'accepted')?.prompt_tokens ?? null;
    const prefill = eventOf(run, 'prefill_end');
    const ttft = tokenEvents(run)[0]?.t_ms ?? null;
    const steps = tokenEvents(run).filter((e) => e.index > 0);
    const stepMs = median(steps.map((e) => e.step_ms));
    const bandwidth = median(steps.map((e) => decodeBytesPerS(facts.weights_bytes, e.cache_bytes_measured, e.step_ms)));
    return {
      label, promptTokens, ttftMs: ttft, prefillMs: prefill?.ms ?? null, stepMs,
      prefillFlopsPerS: prefillFlopsPerS(facts.params, promptTokens, prefill?.ms),
      decodeBytesPerS: bandwidth,
      decodeFlopsPerS: decodeFlopsPerS(facts.params, stepMs),
    };
  });
  const ok = rows.filter((r) => r.promptTokens != null && r.ttftMs != null);
  return {
    rows,
    ttftSeries: [{ name: 'TTFT', points: ok.map((r) => ({ x: r.promptTokens, y: r.ttftMs })) },
                 { name: 'prefill time', points: ok.map((r) => ({ x: r.promptTokens, y: r.prefillMs })) }],
    flopsSeries: [{ name: 'prefill (est.)', points: ok.filter((r) => r.prefillFlopsPerS).map((r) => ({ x: r.promptTokens, y: r.prefillFlopsPerS / 1e9 })) },
                  { name: 'decode (est.)', points: ok.filter((r) => r.decodeFlopsPerS).map((r) => ({ x: r.promptTokens, y: r.decodeFlopsPerS / 1e9 })) }],
  };
}

// Lanes on one browser clock: waiting (sent → prefill starts), prefill, decode.
export function analyseConcurrent(results) {
  const origin = Math.min(...results.map(({ run }) => run.sentAt));
  const lanes = results.map(({ label, run }) => {
    const sent = run.sentAt - origin;
    const start = receivedAt(run, 'prefill_start', origin);
    const end = receivedAt(run, 'prefill_end', origin);
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
    queueMs: eventOf(run, 'prefill_start')?.t_ms ?? null,
    status: run.status,
  }));
  return { lanes, rows };
}
