// The serving chapter's "Why the same prompt can answer differently" stage: its own section after the
// numbered stages, drawn from its own recording (static/data/invariance-trace.json, written by
// scripts/record_invariance_trace.py) or a live run (POST /api/experiments/batch_invariance). For the default
// route and batch-invariant mode: which batched answers were the lone ones, the first parting's two candidates
// and their logit gap, and the step times. mount(el) → { destroy() }; every number goes in through textContent.
import { html } from '../shared/dom.js';
import { MISSING, formatFixed, formatInt, formatMs } from '../shared/format.js';
import { runExperiment, listExperiments } from './data.js';
import { CLAIMS, MODES, agreement, gapText, loadText, loadsOf, rateText } from './batch-invariance-math.js';
import { clear, setting, table, tag, value } from './view.js';
import { decoderOf } from '../shared/route.js';

export const NAME = 'batch_invariance';
export const TRACE_URL = new URL('../../data/invariance-trace.json', import.meta.url);

// The recording → {recordedOn, response}; null when none ships with the page.
async function loadRecording(signal) {
  const res = await fetch(TRACE_URL, { signal });
  if (res.status === 404) return null;
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  const data = await res.json();
  if (!data || data.schema !== 1 || !data.experiment?.result) throw new Error('not an invariance recording (schema 1)');
  return { recordedOn: data.recorded_on || {}, response: data.experiment };
}

// Where the figure's numbers come from: the recording (its machine, date, size and load as it began and
// ended) or this server's live run (its load as the answer was built).
function sourceLine(node, response, recordedOn) {
  node.replaceChildren();
  const m = response.machine || {};
  const r = response.result || {};
  if (recordedOn) {
    node.append('Recorded run ');
    value(node, `${recordedOn.model || 'model not named'}, ${recordedOn.machine || 'machine not recorded'}`
      + `${recordedOn.cpu_capability ? ` (${recordedOn.cpu_capability})` : ''}, ${recordedOn.date || 'date not given'}`,
    'measured', 'sv-source-detail');
    node.append(', on ');
    setting(node, decoderOf(m.decoder ? m : recordedOn), 'sv-decoder');
  } else {
    node.append('Live run ');
    value(node, m.device || m.cpu || 'this server', 'measured', 'sv-source-detail');
    node.append(', on ');
    setting(node, decoderOf(m), 'sv-decoder'); // as the server reports the decoder that ran the steps
  }
  node.append(', ');
  setting(node, formatInt(r.requests));
  node.append(' questions, up to ');
  setting(node, formatInt(r.new_tokens));
  node.append(' new tokens each, load ');
  const loads = loadsOf(m, recordedOn);
  value(node, loads.length ? loadText(loads) : MISSING, 'measured');
  node.append(' ');
  tag(node, 'measured');
}

function partingBox(parent, p) {
  const box = html('div', { cls: 'sv-inv-parting', parent });
  if (!p) {
    html('p', { cls: 'sv-note', text: 'No batched answer parted from its lone one.', parent: box });
    return;
  }
  const head = html('p', { cls: 'sv-note', parent: box });
  head.append('First parting: request ');
  value(head, p.request, 'measured');
  head.append(' at token ');
  value(head, formatInt(p.index + 1), 'measured');
  head.append(': alone the model chose ');
  value(head, `“${p.tokens[0].text}”`, 'measured', 'sv-num sv-token');
  head.append(', in the batch ');
  value(head, `“${p.tokens[1].text}”`, 'measured', 'sv-num sv-token');
  table(box, {
    head: ['', 'p(alone\'s token)', 'p(batch\'s token)', 'logit gap'],
    rows: ['alone', 'batched'].map((where) => {
      const side = where === 'alone' ? p.alone : p.batched;
      const prob = (x) => (Number.isFinite(x) ? [formatFixed(x, 5), 'measured'] : ['not in the top 5', 'measured']);
      return [where, prob(side.probs[0]), prob(side.probs[1]), [gapText(side.logit_gap), 'computed']];
    }),
  });
}

function modeColumn(parent, name, title, run) {
  const col = html('div', { cls: 'sv-col', parent });
  col.dataset.run = name;
  html('p', { cls: 'sv-sub', text: title, parent: col });
  const { same, of } = agreement(run);
  const line = html('p', { cls: 'sv-note', parent: col });
  const count = html('span', { parent: line }); // "6 of 8": a count measured, of the requests the run set
  count.dataset.key = `${name}-same`;
  value(count, formatInt(same), 'measured');
  count.append(' of ');
  setting(count, formatInt(of));
  line.append(' batched answers were the lone ones');
  table(col, {
    head: ['request', 'batched answer'],
    rows: run.requests.map((r) => [r.request, [r.same_answer ? 'the lone one' : `parts at token ${formatInt(r.parts_at + 1)}`,
      'measured']]),
  });
  partingBox(col, run.first_parting);
  table(col, {
    head: ['', 'median step', 'tokens/s'],
    rows: ['alone', 'batched'].map((where) => [where, [formatMs(run.step_ms_median[where]), 'measured'],
      [rateText(run.tokens_per_s[where]), 'computed']]), // tokens over a measured time: worked out, not read
  });
}

function drawClaims(nodes, response, recordedOn) {
  for (const node of nodes) { node.replaceChildren(); node.hidden = true; }
  for (const claim of CLAIMS) {
    const c = response?.result ? claim(response.result, response.machine || {}, recordedOn) : null;
    const node = c && nodes.find((n) => n.dataset.claim === c.id);
    if (!node) continue;
    node.hidden = false;
    for (const part of c.parts) {
      if (typeof part === 'string') node.append(part);
      else if (part[1] === 'setting') setting(node, part[0]); // a threshold or input the run was given
      else value(node, part[0], part[1]);
    }
  }
}

export function mount(el) {
  const q = (s) => el.querySelector(s);
  const dom = { figure: q('.sv-inv-figure'), source: q('.sv-inv-source'), run: q('.sv-inv-run'),
    back: q('.sv-inv-back'), status: q('.sv-inv-status'), claims: [...el.querySelectorAll('[data-claim]')] };
  const aborter = new AbortController();
  const state = { recorded: undefined, live: null, showLive: false, running: false, available: false };
  // The response shown now and its recording's facts (null for a live run); null while there is none.
  function shown() {
    if (state.showLive && state.live) return { response: state.live, recordedOn: null };
    if (state.recorded) return state.recorded;
    return null;
  }

  function draw() {
    const now = shown();
    clear(dom.figure);
    if (now) sourceLine(dom.source, now.response, now.recordedOn);
    else dom.source.textContent = state.recorded === undefined ? 'Loading the recorded run…' : 'No recorded run ships with the page.';
    const result = now?.response?.result;
    drawClaims(dom.claims, now?.response, now?.recordedOn || null);
    dom.back.hidden = !(state.showLive && state.recorded);
    dom.run.disabled = state.running || !state.available;
    if (!result) return;
    const pair = html('div', { cls: 'sv-pair', parent: dom.figure });
    for (const [name, title] of MODES) if (result.runs[name]) modeColumn(pair, name, title, result.runs[name]);
  }

  async function runLive() {
    if (state.running) return;
    state.running = true;
    dom.status.textContent = 'Running on this server: each request alone, then all together, in both modes…';
    draw();
    let outcome;
    try {
      outcome = await runExperiment(NAME, {}, aborter.signal);
    } catch {
      return; // aborted: the stage was destroyed
    }
    state.running = false;
    if (outcome.ok) {
      state.live = outcome.response;
      state.showLive = true;
      dom.status.textContent = 'Live run finished; the figure shows it.';
    } else {
      dom.status.textContent = `The experiment did not run: ${outcome.error.message}`;
    }
    draw();
  }

  const onRun = () => runLive();
  const onBack = () => { state.showLive = false; dom.status.textContent = ''; draw(); };
  dom.run.addEventListener('click', onRun);
  dom.back.addEventListener('click', onBack);
  draw();
  loadRecording(aborter.signal).then((rec) => { state.recorded = rec; draw(); }).catch((err) => {
    if (err.name === 'AbortError') return;
    state.recorded = null;
    dom.status.textContent = `The recorded run could not be loaded (${err.message}).`;
    draw();
  });
  listExperiments(aborter.signal).then((list) => {
    const offer = list?.available?.[NAME];
    state.available = !!offer?.available;
    dom.run.title = state.available ? 'Measure this on this server now' : (offer?.why || 'Not available on this server');
    draw();
  }).catch(() => {});
  return {
    destroy() {
      aborter.abort();
      dom.run.removeEventListener('click', onRun);
      dom.back.removeEventListener('click', onBack);
      clear(dom.figure);
    },
  };
}
