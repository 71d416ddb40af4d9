// The answer panel's DOM for one run: status sentence, the answer as token boxes (model text only
// via textContent), each token's top-5 candidates on hover or arrow keys, the metrics list and the
// per-token latency and cache-growth charts. A run that did not finish is marked so on the answer.
import { lineChart } from '../charts/charts.js';
import { html } from '../shared/dom.js';
import { MISSING, formatInt as fmtInt, formatMs } from '../shared/format.js';
import { EVENT } from '../shared/protocol.js';
import { summarize, tokenSeries } from './metrics.js';
import { describeStatus, isDone } from './run-state.js';

const fmtMs = (v) => formatMs(v, { digits: 1 });
// Quotes make leading spaces visible; newlines and tabs get a visible sign.
export const showToken = (text) => `“${text.replace(/\n/g, '↵').replace(/\t/g, '⇥')}”`;

// A remote engine (kvscope serve --engine) sends null for what a client cannot see inside the server.
const NOT_VISIBLE = 'not visible from outside the server';
const isRemote = (events) => events.some((e) => e.type === EVENT.TOKEN && e.kv_blocks === null);

const CUT = { max_tokens: 'cut at max new tokens', context_full: 'cut: the context window is full', timeout: 'cut: time limit' };

// The mark after an answer: why it is not a whole answer, or '' when it is.
function endMark(run) {
  if (run.status === 'cancelled') return ` ⏹ did not finish: stopped after ${run.terminal.tokens} tokens`;
  if (run.status === 'connection_lost') return ' ⚠ did not finish: the connection was lost';
  if (run.status === 'error') return run.tokens.length ? ' ⚠ did not finish: the request failed' : '⚠ no answer: the request failed';
  return CUT[run.terminal?.reason] ? ` ✂ ${CUT[run.terminal.reason]}` : '';
}

// A constrained step's mask in words (measured: the bitmask the engine applied); nothing otherwise.
export function maskNote(mask) {
  if (!mask) return [];
  const verdict = mask.first_allowed
    ? "the model's own first choice was allowed"
    : "the model's own first choice was forbidden, so the answer took an allowed token instead";
  const note = html('p', { cls: 'lab-mask-note' });
  note.textContent = `The grammar allowed ${mask.allowed.toLocaleString('en-US')} `
    + `${mask.allowed === 1 ? 'token' : 'tokens'} at this step; ${verdict}. `
    + 'The tokens below are the likeliest allowed ones (forbidden tokens had probability 0).';
  return [note];
}

// Its listeners and pending animation frame end with the lab's `figure`.
export function createRunView(root, figure) {
  const statusEl = root.querySelector('#lab-status');
  const answerEl = root.querySelector('#lab-answer');
  const candEl = root.querySelector('#lab-candidates');
  const metricsEl = root.querySelector('#lab-metrics');
  const latencyEl = root.querySelector('#lab-latency-chart');
  const cacheEl = root.querySelector('#lab-cache-chart');
  let run = null;
  let rendered = 0; // token boxes already in the answer
  let selected = -1;
  let frame = 0;

  function tokenBox(tok) {
    const span = html('span', { cls: 'atok', text: tok.text });
    span.dataset.index = String(tok.index);
    if (!tok.text) span.classList.add(tok.pending ? 'atok-pending' : 'atok-empty');
    return span;
  }

  function renderCandidates(i) {
    const tok = run?.tokens[i];
    if (!tok) return;
    const head = html('p');
    const chosen = tok.candidates.find((c) => c.id === tok.id);
    // A candidate's text is the token itself; a token's own `text` is what it released (maybe "").
    head.textContent = `Token ${tok.index}: chose ${showToken(chosen ? chosen.text : tok.text)} (id ${tok.id}, `
      + `p = ${(tok.prob * 100).toFixed(1)}%)${tok.pending ? ' — part of a character still being completed' : ''}`;
    const table = html('table', { cls: 'lab-cand-table' });
    html('caption', { text: 'Five most likely tokens at this step', parent: table });
    for (const c of tok.candidates) {
      const tr = html('tr', { cls: c.id === tok.id ? 'is-chosen' : null });
      const bar = html('td');
      html('span', { cls: 'lab-cand-bar', parent: bar }).style.width = `${Math.max(1, c.prob * 100)}%`;
      for (const text of [showToken(c.text), `${(c.prob * 100).toFixed(1)}%`, c.id === tok.id ? 'chosen' : '']) {
        html('td', { text, parent: tr });
      }
      tr.append(bar);
      table.append(tr);
    }
    if (!chosen) head.textContent += ' — sampled from outside the top five';
    candEl.replaceChildren(head, ...maskNote(tok.mask), table);
    answerEl.querySelectorAll('.atok.is-selected').forEach((s) => s.classList.remove('is-selected'));
    answerEl.querySelector(`.atok[data-index="${tok.index}"]`)?.classList.add('is-selected');
    selected = i;
  }

  function onPoint(ev) {
    const box = ev.target.closest('.atok');
    if (box) renderCandidates(Number(box.dataset.index));
  }

  function onKey(ev) {
    if (!run || !run.tokens.length) return;
    const moves = { ArrowRight: 1, ArrowLeft: -1, Home: -Infinity, End: Infinity };
    if (!(ev.key in moves)) return;
    ev.preventDefault();
    const next = Math.min(run.tokens.length - 1, Math.max(0, (selected < 0 ? -1 : selected) + moves[ev.key]));
    renderCandidates(Number.isFinite(next) ? next : 0);
  }

  function appendTokens() {
    const frag = document.createDocumentFragment();
    for (; rendered < run.tokens.length; rendered += 1) frag.append(tokenBox(run.tokens[rendered]));
    answerEl.append(frag);
  }

  // What the answer becomes once the run ends: buffered text arrives whole; an answer that did
  // not finish, or was cut at a limit, gets a visible end mark so it never reads as complete.
  function finishAnswer() {
    if (run.payload.delivery === 'buffered' && run.text) {
      html('span', { cls: 'lab-answer-text', text: run.text, parent: answerEl });
    }
    const mark = endMark(run);
    if (mark) {
      html('span', { cls: run.complete ? 'lab-answer-end lab-answer-cut' : 'lab-answer-end', text: mark, parent: answerEl });
    }
    answerEl.dataset.complete = String(run.complete);
  }

  function setMetric(name, text) { metricsEl.querySelector(`[data-metric="${name}"] dd`).textContent = text; }

  function renderMetrics() {
    const m = summarize(run.events);
    const hidden = isRemote(run.events) ? NOT_VISIBLE : MISSING;
    setMetric('queue', m.queueMs == null ? hidden : fmtMs(m.queueMs));
    setMetric('ttft', fmtMs(m.ttftMs));
    setMetric('tpot', fmtMs(m.tpotMs));
    setMetric('itl', m.itlP50 == null ? MISSING : `${m.itlP50.toFixed(1)} / ${m.itlP90.toFixed(1)} / ${m.itlP99.toFixed(1)} ms`);
    setMetric('e2e', fmtMs(m.e2eMs));
    setMetric('tps', m.decodeTokensPerS == null ? MISSING : `${m.decodeTokensPerS.toFixed(1)} tokens/s`);
    setMetric('cache', m.cacheBytesMeasured == null ? hidden
      : `${fmtInt(m.cacheBytesMeasured)} B measured vs ${fmtInt(m.cacheBytesFormula)} B formula `
        + `(${fmtInt(m.cacheTokens)} positions${m.cacheBytesMeasured === m.cacheBytesFormula ? ', equal' : ''})`);
    return m;
  }

  function renderCharts() {
    const series = tokenSeries(run.events);
    const decode = series.filter((s) => s.index > 0);
    lineChart(latencyEl, {
      title: 'Per-token latency', desc: 'Decode step time (the model step alone) and the gap since the previous token (ITL), by token index, in ms.',
      xLabel: 'token index', yLabel: 'ms',
      series: [
        { name: 'step time', points: decode.map((s) => ({ x: s.index, y: s.stepMs })), style: 'line' },
        { name: 'gap (ITL)', points: series.slice(1).map((s, i) => ({ x: s.index, y: s.tMs - series[i].tMs })), style: 'line' },
      ],
    });
    lineChart(cacheEl, {
      title: 'KV cache growth', desc: 'Bytes of KV cache held after each token: measured from the tensors and from the formula.',
      xLabel: 'token index', yLabel: 'bytes',
      series: [
        { name: 'measured', points: series.map((s) => ({ x: s.index, y: s.bytesMeasured })), style: 'line' },
        { name: 'formula', points: series.map((s) => ({ x: s.index, y: s.bytesFormula })), style: 'points', hollow: true },
      ],
    });
  }

  function renderNow() {
    frame = 0;
    statusEl.textContent = describeStatus(run);
    statusEl.dataset.status = run.status;
    appendTokens();
    renderMetrics();
    renderCharts();
    if (isDone(run) && !answerEl.dataset.ended) {
      finishAnswer();
      answerEl.dataset.ended = 'true';
    }
  }

  figure.listen(answerEl, 'mouseover', onPoint);
  figure.listen(answerEl, 'keydown', onKey);

  return {
    show(next) {
      run = next;
      rendered = 0;
      selected = -1;
      answerEl.replaceChildren();
      answerEl.dataset.complete = 'false';
      delete answerEl.dataset.ended;
      answerEl.classList.toggle('is-buffered', run.payload.delivery === 'buffered');
      candEl.replaceChildren();
      renderNow();
    },
    // Coalesces bursts of events into one render per animation frame.
    update() {
      if (!frame) frame = figure.frame(renderNow);
    },
    // Renders immediately (the terminal event must never wait for a frame that may not come).
    flush() {
      if (frame) figure.cancelFrame(frame);
      renderNow();
    },
  };
}
