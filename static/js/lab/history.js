// The history panel's DOM: one table row of metrics per run (kept in memory), the outcome count
// with TTFT/E2E percentiles across runs, distribution charts, and per-run export / replay, plus
// import of a trace file as a run of its own.
import { histogram } from '../charts/charts.js';
import { html, prefersReducedMotion } from '../shared/dom.js';
import { MISSING, formatFixed } from '../shared/format.js';
import { EVENT } from '../shared/protocol.js';
import { summarize, percentile } from './metrics.js';
import { isDone } from './run-state.js';
import { traceOfRun, runFromTrace, parseTrace, serializeTrace } from './trace-io.js';

const f1 = (v) => formatFixed(v, 1);
const trio = (a, b, c) => (a == null ? MISSING : `${f1(a)} / ${f1(b)} / ${f1(c)}`);

function outcome(run) {
  const t = run.terminal;
  if (run.clientError) return 'connection lost';
  if (!t) return `running (${run.status})`;
  if (t.type === EVENT.FINISHED) return `finished: ${t.reason}`;
  if (t.type === EVENT.CANCELLED) return `cancelled after ${t.tokens} tokens`;
  return `error: ${t.code}`;
}

export function mountHistory(root, { getFacts }, figure) {
  const body = root.querySelector('#lab-history-table tbody');
  const outcomesEl = root.querySelector('#lab-outcomes');
  const itlEl = root.querySelector('#lab-itl-hist');
  const itlCaption = root.querySelector('#lab-itl-hist-caption');
  const ttftEl = root.querySelector('#lab-ttft-hist');
  const importInput = root.querySelector('#lab-import-file');
  const importStatus = root.querySelector('#lab-import-status');
  const runs = [];
  let selectedId = null;
  let nextId = 1;

  function cells(run) {
    const m = summarize(run.events);
    return [String(run.id), `${run.kind}${run.label ? ` · ${run.label}` : ''}`, outcome(run), m.promptTokens ?? MISSING, m.tokens,
      f1(m.queueMs), f1(m.ttftMs), f1(m.tpotMs), trio(m.itlP50, m.itlP90, m.itlP99), f1(m.e2eMs), f1(m.decodeTokensPerS)];
  }

  function actionButton(text, action, longName) {
    const b = html('button', { text });
    b.type = 'button';
    b.dataset.action = action;
    b.setAttribute('aria-label', longName);
    b.title = longName;
    return b;
  }

  function rowFor(run) {
    let tr = body.querySelector(`tr[data-run="${run.id}"]`);
    if (!tr) {
      tr = html('tr');
      tr.dataset.run = String(run.id);
      body.prepend(tr);
    }
    const tds = cells(run).map((text) => html('td', { text: String(text) }));
    const actions = html('td', { cls: 'lab-actions' });
    if (isDone(run)) {
      actions.append(actionButton('Gaps', 'select', `Chart the inter-token gaps of run ${run.id}`),
        actionButton('Export', 'export', `Export run ${run.id} as a JSON trace`),
        actionButton('Replay', 'replay', `Replay run ${run.id} in the walkthrough`));
    }
    tr.replaceChildren(...tds, actions);
    tr.dataset.status = run.status;
    tr.classList.toggle('is-selected', run.id === selectedId);
  }

  function renderOutcomes() {
    const done = runs.filter(isDone);
    const count = (pred) => done.filter(pred).length;
    const finished = done.filter((r) => r.status === 'finished').map((r) => summarize(r.events));
    const ttft = finished.map((m) => m.ttftMs);
    const e2e = finished.map((m) => m.e2eMs);
    outcomesEl.textContent = `${done.length} runs ended: ${count((r) => r.status === 'finished')} finished, `
      + `${count((r) => r.status === 'cancelled')} cancelled, ${count((r) => r.status === 'error' || r.status === 'connection_lost')} failed. `
      + `Across finished runs, TTFT p50/p90/p99 ${trio(...[50, 90, 99].map((p) => percentile(ttft, p)))} ms; `
      + `E2E p50/p90/p99 ${trio(...[50, 90, 99].map((p) => percentile(e2e, p)))} ms.`;
    histogram(ttftEl, {
      title: 'TTFT across runs', desc: 'How many runs had each time to first token, in ms.',
      xLabel: 'TTFT ms', values: done.map((r) => summarize(r.events).ttftMs).filter((v) => v != null), binCount: 10,
    });
  }

  function select(run) {
    selectedId = run.id;
    body.querySelectorAll('tr').forEach((tr) => tr.classList.toggle('is-selected', tr.dataset.run === String(run.id)));
    const m = summarize(run.events);
    itlCaption.firstChild.textContent = `Inter-token gaps of run ${run.id} (${m.itlMs.length} gaps) `;
    histogram(itlEl, {
      title: `Inter-token latency, run ${run.id}`, desc: 'How many gaps between consecutive tokens fell in each range, in ms.',
      xLabel: 'gap between tokens, ms', values: m.itlMs,
    });
  }

  async function download(run) {
    const trace = traceOfRun(run, await getFacts());
    const url = URL.createObjectURL(new Blob([serializeTrace(trace)], { type: 'application/json' }));
    const a = html('a');
    a.href = url;
    a.download = `kvscope-trace-${run.requestId || run.id}.json`;
    document.body.append(a);
    a.click();
    a.remove();
    // The download has started by the next task; the URL is no longer needed after that. (A plain
    // timer, not the figure's: the URL must be revoked even if the lab is destroyed meanwhile.)
    setTimeout(() => URL.revokeObjectURL(url), 0);
  }

  async function replay(run) {
    const trace = traceOfRun(run, await getFacts());
    document.dispatchEvent(new CustomEvent('kvscope:replay-trace', { detail: trace }));
    document.getElementById('walkthrough')?.scrollIntoView({ behavior: prefersReducedMotion() ? 'auto' : 'smooth', block: 'start' });
  }

  function onClick(ev) {
    const button = ev.target.closest('button[data-action]');
    if (!button) return;
    const run = runs.find((r) => String(r.id) === button.closest('tr').dataset.run);
    if (!run) return;
    ({ select, export: download, replay })[button.dataset.action](run);
  }

  async function onImport() {
    const file = importInput.files[0];
    if (!file) return;
    try {
      const trace = parseTrace(await file.text());
      const run = runFromTrace(trace, nextId);
      nextId += 1;
      runs.push(run);
      refresh(run);
      select(run);
      importStatus.textContent = `Imported ${file.name} as run ${run.id} (${outcome(run)}).`;
    } catch (err) {
      importStatus.textContent = `Could not import ${file.name}: ${err.message}`;
    } finally {
      importInput.value = '';
    }
  }

  // Re-draws a run's row; once it has ended, the totals too, and its distribution is shown.
  function refresh(run) {
    rowFor(run);
    if (!isDone(run)) return;
    renderOutcomes();
    select(run);
  }

  figure.listen(body, 'click', onClick);
  figure.listen(importInput, 'change', onImport);

  return {
    newId() { nextId += 1; return nextId - 1; },
    add(run) { runs.push(run); rowFor(run); },
    refresh,
    runs,
  };
}
