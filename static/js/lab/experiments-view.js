// The experiments' DOM: one button per experiment card runs its planned requests (one after the
// other, or back to back for the concurrency one) through the lab's `launch`, then draws the
// analysis. One experiment runs at a time so their timings do not disturb each other.
import { lineChart, laneChart } from '../charts/charts.js';
import { html } from '../shared/dom.js';
import { MISSING, formatFixed as num, formatMs } from '../shared/format.js';
import {
  EXPERIMENTS, completed, analyseKv, analyseDelivery, analyseSweep, analyseConcurrent, sweepVerdict,
} from './experiments.js';
import { describeStatus } from './run-state.js';
import { fetchModel } from './api.js';

const ms = (v) => formatMs(v, { digits: 0 });
const giga = (v) => (v == null ? null : v / 1e9);

export function mountExperiments(root, launch, figure) {
  const cards = [...root.querySelectorAll('.lab-exp')];
  let busy = false;

  function setBusy(on) {
    busy = on;
    for (const card of cards) card.querySelector('.lab-exp-run').disabled = on;
  }

  async function runPlan(card, experiment) {
    const statusEl = card.querySelector('.lab-exp-status');
    const plan = experiment.plan();
    const liveList = card.querySelector('.lab-lanes-live');
    const results = [];
    const onUpdate = (label, run) => {
      const li = liveList?.querySelector(`[data-lane="${label}"]`);
      if (li) {
        li.textContent = `${label}: ${describeStatus(run)}`;
        li.dataset.status = run.status;
      }
    };
    if (liveList) {
      liveList.replaceChildren(...plan.map(({ label }) => {
        const li = html('li', { text: `${label}: connecting…` });
        li.dataset.lane = label;
        return li;
      }));
    }
    const kind = `experiment: ${experiment.title}`;
    if (experiment.staggered) {
      statusEl.textContent = `Sending ${plan.length} requests, each as soon as the server has accepted the one before…`;
      const launched = [];
      for (const { label, payload } of plan) {
        const l = launchUntilAnswered(launch, payload, { kind, label, onUpdate: (run) => onUpdate(label, run) });
        launched.push({ label, done: l.done });
        await l.answered;
      }
      for (const l of launched) results.push({ label: l.label, run: await l.done });
    } else {
      for (const [i, item] of plan.entries()) {
        statusEl.textContent = `Running ${i + 1} of ${plan.length}: ${item.label}…`;
        const { done } = launch(item.payload, { kind, label: item.label });
        results.push({ ...item, run: await done });
      }
    }
    return results;
  }

  async function onRun(card) {
    if (busy) return;
    const key = card.dataset.experiment;
    const experiment = EXPERIMENTS[key];
    setBusy(true);
    card.dataset.state = 'running';
    const statusEl = card.querySelector('.lab-exp-status');
    try {
      const results = await runPlan(card, experiment);
      const failed = results.filter(({ run }) => !completed(run));
      await DRAW[key](card, results);
      card.dataset.state = failed.length ? 'incomplete' : 'done';
      statusEl.textContent = failed.length
        ? `Done, but ${failed.map(({ label, run }) => `${label}: ${describeStatus(run)}`).join(' ')}`
        : `Done: ${results.length} runs, all complete. Each is also in the history below.`;
    } catch (err) {
      card.dataset.state = 'failed';
      statusEl.textContent = `The experiment could not run: ${err.message}`;
    } finally {
      setBusy(false);
    }
  }

  figure.listen(root, 'click', (ev) => {
    const button = ev.target.closest('.lab-exp-run');
    if (button) onRun(button.closest('.lab-exp'));
  });
}

// Launches a run and also resolves `answered` once the server has said anything about it
// (accepted it, or ended it), so the next request can follow it into the queue.
function launchUntilAnswered(launch, payload, { onUpdate, ...opts }) {
  let answer;
  const answered = new Promise((resolve) => { answer = resolve; });
  const handle = launch(payload, { ...opts, onUpdate: (run) => { onUpdate(run); if (run.status !== 'connecting') answer(); } });
  handle.done.then(answer);
  return { ...handle, answered };
}

function chartEl(card, second = false) { return card.querySelector(second ? '.lab-exp-chart-2' : '.lab-exp-chart'); }
function summary(card, text) { card.querySelector('.lab-exp-summary').textContent = text; }

const DRAW = {
  kv(card, results) {
    const { series, slopes, medians, fastest } = analyseKv(results);
    lineChart(chartEl(card), {
      title: 'Decode step time against position, KV cache on and off',
      desc: 'Each point is one decode step: x is the sequence length it worked on, y its time in ms.',
      xLabel: 'position (prompt + tokens so far)', yLabel: 'step ms', series,
    });
    const { short, long } = fastest['cache off'];
    const on = fastest['cache on'];
    summary(card, `Without the cache the fastest step took ${ms(short?.ms)} at position ${short?.at ?? MISSING} and `
      + `${ms(long?.ms)} at position ${long?.at ?? MISSING}: about ${num(slopes['cache off'], 2)} ms more per position. `
      + `With the cache: ${ms(on.short?.ms)} and ${ms(on.long?.ms)} (${num(slopes['cache on'], 2)} ms per position). `
      + 'Slopes are medians over all pairs of steps and the fastest steps are the least disturbed by anything else '
      + 'on the machine, so one slow step cannot set the result. Measured.');
  },
  delivery(card, results) {
    const { rows, lanes } = analyseDelivery(results);
    laneChart(chartEl(card), {
      title: 'When text became visible, streaming vs buffered',
      desc: 'Time from sending until the first visible text (end of the waiting bar) and until the answer ended, in ms, measured in this browser.',
      xLabel: 'ms since sending (browser clock)', lanes,
      kinds: [{ kind: 'waiting', label: 'no text yet' }, { kind: 'receiving', label: 'text arriving' }],
    });
    summary(card, rows.map((r) => `${r.label}: first text at ${ms(r.firstText)}, answer ended at ${ms(r.total)}`
      + `${r.sameEvent ? ' (the text came with the finish)' : ''}.`).join(' ') + ' Measured in this browser.');
  },
  async sweep(card, results) {
    const model = await fetchModel();
    const facts = model.data?.facts || {};
    const { rows, ttftSeries, flopsSeries } = analyseSweep(results, facts);
    lineChart(chartEl(card), {
      title: 'TTFT and prefill time against prompt length',
      desc: 'x: prompt tokens; y: time to first token and prefill time, in ms (measured).',
      xLabel: 'prompt tokens', yLabel: 'ms', series: ttftSeries,
    });
    lineChart(chartEl(card, true), {
      title: 'Achieved GFLOP/s, prefill vs decode (estimates)',
      desc: 'Estimates: prefill FLOPs (2 × non-embedding parameters × tokens + attention + one row of logits) and a decode step\'s 2 × parameters, each ÷ its measured time.',
      xLabel: 'prompt tokens', yLabel: 'GFLOP/s (estimate)', series: flopsSeries,
    });
    sweepTable(card.querySelector('.lab-exp-table'), rows);
    const long = rows.filter((r) => r.prefillFlopsPerS != null).pop();
    if (!long) {
      summary(card, 'No prompt in the sweep finished, so there is nothing to estimate.');
      return;
    }
    summary(card, sweepSummary(long, sweepVerdict(rows)));
  },
  concurrent(card, results) {
    const { lanes, rows } = analyseConcurrent(results);
    laneChart(chartEl(card), {
      title: 'Two requests sent together', desc: 'Each lane: waiting in the queue, prefill, then decode, on this browser\'s clock in ms.',
      xLabel: 'ms since the first send (browser clock)', lanes,
      kinds: [{ kind: 'queue', label: 'waiting' }, { kind: 'prefill', label: 'prefill' }, { kind: 'decode', label: 'decode' }],
    });
    summary(card, rows.map((r) => (r.maxAhead > 0
      ? `${r.label} waited in the queue (position ${r.positions.join(' → ')}, ${r.maxAhead} ahead) for ${ms(r.queueMs)} before its prefill`
      : `${r.label} started at once (queue wait ${ms(r.queueMs)})`)
      + (r.sharedSteps > 0
        ? `; ${r.sharedSteps} of its decode steps computed the other request's token in the same forward pass (up to ${r.maxBatch} requests a step).`
        : '; none of its decode steps was shared.')).join(' ') + ' Measured.');
  },
};

// The sweep's conclusion, worded from what it measured (sweepVerdict), not a fixed verdict.
export function sweepSummary(long, v) {
  let text = `At ${long.promptTokens} prompt tokens prefill achieved about ${num(giga(long.prefillFlopsPerS))} GFLOP/s, `
    + `while a decode step achieved ${num(giga(long.decodeFlopsPerS))} GFLOP/s and moved about ${num(giga(long.decodeBytesPerS), 2)} GB/s. `;
  if (v && v.prefill === 'climbing') {
    text += `Prefill's rate was still climbing at the longest prompt (×${num(v.prefillGrowth, 1)} from ${v.first.promptTokens} to `
      + `${v.last.promptTokens} tokens): these prompts are too short to fill the arithmetic units, so prefill here is not yet compute-bound. `;
  } else if (v && v.prefill === 'rose-then-level') {
    text += `Prefill's rate rose ×${num(v.prefillGrowth, 1)} from ${v.first.promptTokens} to ${v.last.promptTokens} tokens and then `
      + 'levelled off: the short prompts could not fill the arithmetic units, the longer ones did, as when arithmetic '
      + 'sets the pace (compute-bound). ';
  } else if (v && v.prefill === 'level') {
    text += `Prefill's rate levelled off with prompt length (×${num(v.prefillGrowth, 1)} from ${v.first.promptTokens} to `
      + `${v.last.promptTokens} tokens), as it does once arithmetic sets the pace (compute-bound). `;
  }
  if (v && v.decode === 'slower') {
    text += `A decode step did ${num(v.decodeRatio, 1)}× less arithmetic per second while reading every weight for one token. `
      + 'That alone does not say what held it back: a step is memory-bound only when it moves its bytes near the '
      + 'machine\'s copy bandwidth, which this sweep does not measure (the serving chapter\'s roofline, in Why batch, '
      + 'sets each step beside its own kernels and the copy bandwidth).';
  } else if (v && v.decode === 'unclear') {
    text += `A decode step reached ${num(v.decodeRatio, 1)}× of prefill's rate, so this run does not show decode held back by memory.`;
  }
  return text + ' Estimates from measured times.';
}

function sweepTable(container, rows) {
  const table = html('table', { cls: 'lab-table lab-sweep-table' });
  const caption = html('caption', { text: 'Per prompt length' });
  const head = html('tr');
  for (const h of ['prompt tokens', 'TTFT ms', 'prefill ms', 'prefill GFLOP/s (est.)', 'decode step ms', 'decode GB/s (est.)', 'decode GFLOP/s (est.)']) {
    html('th', { text: h, parent: head }).scope = 'col';
  }
  const thead = html('thead');
  thead.append(head);
  const body = html('tbody');
  for (const r of rows) {
    const tr = html('tr', { parent: body });
    for (const v of [r.promptTokens ?? MISSING, num(r.ttftMs), num(r.prefillMs), num(giga(r.prefillFlopsPerS)),
      num(r.stepMs), num(giga(r.decodeBytesPerS), 2), num(giga(r.decodeFlopsPerS))]) {
      html('td', { text: String(v), parent: tr });
    }
    // Columns 4, 6 and 7 are estimates (computed); the others are measured times and counts.
    [...tr.children].forEach((td, i) => { td.dataset.provenance = [3, 5, 6].includes(i) ? 'computed' : 'measured'; });
  }
  table.append(caption, thead, body);
  const tag = html('p');
  const est = html('span', { cls: 'tag tag-computed', text: 'estimate · derived from measured times' });
  tag.dataset.provenance = 'computed';
  tag.append(est, ' Times are measured; GFLOP/s and GB/s are estimated from them and the model\'s shape: '
    + 'prefill FLOPs = 2 × non-embedding parameters × tokens + causal attention + one row of logits; a decode step ≈ '
    + '2 × parameters; bytes read per decode step ≈ weights + KV cache.');
  container.replaceChildren(table, tag);
  // The table may scroll sideways on a phone: keyboard users need to reach it to scroll it.
  container.tabIndex = 0;
  container.setAttribute('aria-label', 'Sweep results, one row per prompt length');
}
