// The "Many requests at once" chapter. mount(el) loads the recorded serving trace, shows the stage the
// reader has scrolled to (one panel per stage in the sticky figure), and wires the stage controls,
// `#serving-…` deep links, the keyboard and "Run it for real" (POST /api/experiments/<name>). Every
// panel is drawn from its data when the data changes, and a stage change only chooses which panel is
// visible, so scrolling back restores a stage exactly. destroy() undoes all of it (shared/figure.js).
// Each figure module: mount(el) → { show(response), clear(), destroy() }.
import { currentModel } from '../model-status.js';
import { defineFigure } from '../shared/figure.js';
import { finder, html } from '../shared/dom.js';
import { formatFixed, formatInt } from '../shared/format.js';
import { observeSteps, scrollToStep } from '../shared/scroll.js';
import { listExperiments, runExperiment } from './data.js';
import { loadTrace } from '../shared/serving-trace.js';
import { setting, value } from './view.js';
import { CLAIMS } from './claims.js';
import { decoderOf, servingRoute } from '../shared/route.js';
import * as whyBatch from './why-batch.js';
import * as batching from './batching.js';
import * as paged from './paged-blocks.js';
import * as chunked from './chunked-prefill.js';
import * as prefix from './prefix-caching.js';
import * as attentionCost from './attention-cost.js';
import * as speculative from './speculative.js';
import * as disagg from './disagg.js';
import * as worked from './pricing.js';
import * as invariance from './batch-invariance.js';

const MODULES = { 'why-batch': whyBatch, batching, paged, chunked, prefix, 'attention-cost': attentionCost, speculative,
  disagg, worked };
const NEXT_KEYS = new Set(['ArrowRight', 'ArrowDown', 'PageDown']);
const PREV_KEYS = new Set(['ArrowLeft', 'ArrowUp', 'PageUp']);
// Figures that draw something even without data (the diagram, the worked-example calculator).
const ALWAYS = new Set(['disagg', 'worked']);

let ctx = null; // the mounted chapter's state; null once destroyed, which async work checks

const stageAt = (i) => ctx.stages[i];
const experimentOf = (stage) => ctx.panels[stage].dataset.experiment || null;
const dataNameOf = (stage) => experimentOf(stage) || ctx.panels[stage].dataset.uses || null;

// The response a panel shows now, and where it came from: a live run if the reader chose one.
function dataFor(stage) {
  const name = dataNameOf(stage);
  if (!name) return { response: null, source: 'schematic' };
  if (!experimentOf(stage)) { // a schematic figure that quotes another experiment's result
    const quoted = ctx.showLive.has(name) ? ctx.live[name] : ctx.recorded?.experiments?.[name];
    return { response: quoted?.result ? quoted : null, source: 'schematic' };
  }
  if (ctx.showLive.has(name) && ctx.live[name]) return { response: ctx.live[name], source: 'live' };
  const recorded = ctx.recorded?.experiments?.[name];
  if (recorded && recorded.result) return { response: recorded, source: 'recorded' };
  return { response: null, source: ctx.recorded === undefined ? 'loading' : 'none' };
}

// ---- drawing --------------------------------------------------------------------------------------

function emptyNote(stage) {
  const note = ctx.notes[stage];
  const { source } = dataFor(stage);
  // A figure that draws without data says itself what is missing.
  note.hidden = ALWAYS.has(stage) || !(source === 'none' || source === 'loading');
  note.textContent = source === 'loading' ? 'Loading the recorded run…'
    : 'No recorded run of this experiment ships with the page. Press “Run it for real” to measure it on this server.';
}

function drawPanel(stage) {
  const fig = ctx.figures[stage];
  const { response } = dataFor(stage);
  emptyNote(stage);
  try {
    if (response || ALWAYS.has(stage)) fig.show(response);
    else fig.clear();
  } catch (err) {
    fig.clear();
    ctx.notes[stage].hidden = false;
    ctx.notes[stage].textContent = `This experiment's data could not be drawn (${err.message}).`;
  }
  ctx.bodies[stage].hidden = !response && !ALWAYS.has(stage);
}

// The step text's sentences that relate figures ([data-claim]), computed from the run the panel shows
// (claims.js); a sentence without its data is hidden, never shown with blanks.
function drawClaims(stage) {
  const name = experimentOf(stage);
  const { response, source } = dataFor(stage);
  const made = {};
  for (const claim of (name && CLAIMS[name]) || []) {
    const c = response && response.result ? claim(response.result, source === 'live' ? 'live' : 'recorded') : null;
    if (c) made[c.id] = c;
  }
  for (const node of ctx.dom.steps[ctx.stages.indexOf(stage)].querySelectorAll('[data-claim]')) {
    const c = made[node.dataset.claim];
    node.hidden = !c;
    node.replaceChildren();
    if (!c) continue;
    for (const part of c.parts) {
      if (typeof part === 'string') node.append(part);
      else if (part[1] === 'setting') setting(node, part[0]); // an input the run was given, not a finding
      else value(node, part[0], part[1]);
    }
  }
}

function drawAll() {
  for (const stage of ctx.stages) {
    drawPanel(stage);
    drawClaims(stage);
  }
  render();
}

function sourceLine(stage) {
  const node = ctx.dom.source;
  node.replaceChildren();
  const { response, source } = dataFor(stage);
  const text = (t) => html('span', { cls: 'sv-source-text', text: t, parent: node });
  const tagOf = (p) => html('span', { cls: `tag tag-${p}`, text: p, parent: node });
  if (source === 'schematic') {
    text(response ? 'Schematic; its one number is from the chunked-prefill run ' : 'Schematic figure ');
    tagOf('schematic');
    return;
  }
  if (source === 'loading') { text('Loading the recorded run…'); return; }
  if (source === 'none') { text('No recorded run'); return; }
  if (source === 'recorded') {
    const on = ctx.recorded.recordedOn || {};
    const m = response.machine || {};
    text('Recorded run ');
    // The route the weights ran on sets every number: named always, even where the details are hidden.
    const route = servingRoute(ctx.recorded, response);
    value(node, `${route || 'route not recorded'} weights`, 'measured', 'sv-num sv-route');
    node.append(', ');
    // Where and when the recording script ran, as it wrote them down (the model line without its route).
    const model = (on.model || 'model not named').replace(new RegExp(`,\\s*${route}$`), '');
    // An experiment recorded later and merged in (record_serving_trace.py --only) has its own date.
    const merged = (on.merged || []).findLast((m) => (m.experiments || []).includes(dataNameOf(stage)));
    const date = merged?.date || on.date;
    // the machine it was recorded on, as the recording names it: never "this machine"
    const machine = merged?.machine || on.machine || 'machine not recorded';
    const isa = merged?.cpu_capability || on.cpu_capability;
    value(node, `${model}, ${machine}${isa ? ` (${isa})` : ''}, ${date || 'date not given'}`,
      'measured', 'sv-source-detail');
    node.append(', on ');
    // the decoder that ran its steps: how the run was made (the experiment's own where it names one)
    setting(node, decoderOf(m.decoder ? m : on), 'sv-decoder');
    node.append(', load ');
    // This experiment's own load when the recording has it, else the recording's at its start.
    value(node, formatFixed(Number.isFinite(m.load_1m) ? m.load_1m : on.load_1m, 2), 'measured');
  } else {
    const m = response.machine || {};
    text('Live run ');
    value(node, m.device || m.cpu || 'this server', 'measured', 'sv-source-detail');
    if (!m.device && Number.isFinite(m.threads)) { // the device line already names its threads
      node.append(', ');
      value(node, `${formatInt(m.threads)} threads`, 'measured');
    }
    node.append(', on ');
    setting(node, decoderOf(m), 'sv-decoder'); // as the server reports the decoder that ran the steps
    node.append(', load ');
    value(node, formatFixed(m.load_1m, 2), 'measured');
  }
  node.append(' ');
  tagOf(response?.provenance || 'measured');
}

function render() {
  const { index, dom } = ctx;
  const stage = stageAt(index);
  dom.figure.dataset.stage = stage;
  dom.figure.dataset.source = dataFor(stage).source;
  for (const s of ctx.stages) ctx.panels[s].hidden = s !== stage;
  dom.figure.scrollTop = 0; // a new stage starts at its top when the figure scrolls inside
  dom.num.textContent = String(index + 1);
  dom.name.textContent = dom.steps[index].dataset.title;
  dom.list.forEach((b, i) => (i === index ? b.setAttribute('aria-current', 'step') : b.removeAttribute('aria-current')));
  dom.steps.forEach((s, i) => s.classList.toggle('is-active', i === index));
  dom.prev.disabled = index === 0;
  dom.next.disabled = index === ctx.stages.length - 1;
  sourceLine(stage);
  updateButtons();
}

// ---- stages ---------------------------------------------------------------------------------------

function setStage(i, { scroll = false, hash = false } = {}) {
  const index = Math.max(0, Math.min(ctx.stages.length - 1, i));
  const changed = index !== ctx.index;
  ctx.index = index;
  if (changed) render();
  if (scroll) scrollToStep(ctx.dom.steps[index]);
  if (hash) history.replaceState(null, '', `#serving-${stageAt(index)}`);
}

const jump = (i) => setStage(i, { scroll: true, hash: true });

function onScrolledTo(i) {
  if (i !== ctx.index) setStage(i);
}

function stageFromHash() {
  const m = /^#serving-([a-z-]+)$/.exec(location.hash);
  return m ? ctx.stages.indexOf(m[1]) : -1;
}

function onKey(event) {
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  if (event.target.closest('input, select, textarea')) return; // a slider or field uses its own keys
  let target = null;
  if (NEXT_KEYS.has(event.key)) target = ctx.index + 1;
  else if (PREV_KEYS.has(event.key)) target = ctx.index - 1;
  else if (event.key === 'Home') target = 0;
  else if (event.key === 'End') target = ctx.stages.length - 1;
  if (target === null) return;
  event.preventDefault();
  jump(target);
}

// ---- live runs --------------------------------------------------------------------------------------

function say(text) {
  ctx.dom.status.textContent = text;
}

function updateButtons(info = currentModel()) {
  const { dom } = ctx;
  const stage = stageAt(ctx.index);
  const name = experimentOf(stage);
  const ready = !!(info && info.status === 'ready');
  const offer = ctx.offered?.[name];
  dom.run.hidden = !name;
  dom.run.disabled = !name || !ready || !offer?.available || !!ctx.running;
  if (!ready) dom.run.title = 'Waiting for the model to load';
  else if (ctx.offered === null) dom.run.title = 'This server runs no experiments';
  else if (offer && !offer.available) dom.run.title = offer.why || 'Not available on this server';
  else dom.run.title = 'Measure this experiment on this server now';
  const dataName = dataNameOf(stage);
  dom.back.hidden = !(dataName && ctx.showLive.has(dataName) && ctx.recorded?.experiments?.[dataName]);
}

function failure(error) {
  const where = error.field ? ` (${error.field})` : '';
  if (error.code === 'busy') return 'Another experiment is running; try again when it ends.';
  if (error.code === 'not_allowed') return `This server does not allow that experiment: ${error.message}`;
  return `The experiment failed${where}: ${error.message}`;
}

async function runLive() {
  const stage = stageAt(ctx.index);
  const name = experimentOf(stage);
  if (!name || ctx.running) return;
  const title = ctx.dom.steps[ctx.index].dataset.title;
  ctx.running = name;
  updateButtons();
  say(`Running “${title}” on this server (one experiment at a time)…`);
  let outcome;
  try {
    outcome = await runExperiment(name, {}, ctx.figure.signal);
  } catch {
    return; // aborted: the chapter was destroyed
  }
  if (!ctx) return;
  ctx.running = null;
  if (outcome.ok) {
    ctx.live[name] = outcome.response;
    ctx.showLive.add(name);
    say(`Live run of “${title}” finished; its figure shows it.`);
    drawAll();
  } else {
    say(failure(outcome.error));
    updateButtons();
  }
}

function showRecorded() {
  const name = dataNameOf(stageAt(ctx.index));
  ctx.showLive.delete(name);
  say('');
  drawAll();
}

async function loadRecorded() {
  try {
    ctx.recorded = await loadTrace(ctx.figure.signal);
    if (!ctx) return;
    if (!ctx.recorded) say('No recorded run ships with this page: press “Run it for real” to measure each experiment.');
  } catch (err) {
    if (!ctx || err.name === 'AbortError') return;
    ctx.recorded = null;
    say(`The recorded run could not be loaded (${err.message}).`);
  }
  drawAll();
  // the step texts now say what the recording holds (tests and scripts wait on this, not on a delay)
  ctx.dom.figure.dataset.recording = ctx.recorded ? 'loaded' : 'none';
  if (ctx.anchored) scrollToStep(ctx.dom.steps[ctx.index]);
}

async function loadOffer() {
  try {
    const list = await listExperiments(ctx.figure.signal);
    if (!ctx) return;
    ctx.offered = list ? list.available : null; // name → {available, why}; null: no experiments here
  } catch (err) {
    if (!ctx || err.name === 'AbortError') return;
    ctx.offered = null;
  }
  if (ctx) updateButtons();
}

// ---- wiring ---------------------------------------------------------------------------------------

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const dom = {
    figure: q('.sv-figure'), sticky: q('.sv-sticky'), prev: q('.sv-prev'), next: q('.sv-next'), run: q('.sv-run'),
    back: q('.sv-back'), status: q('.sv-run-status'), source: q('.sv-source'), num: q('.sv-stage-num'),
    name: q('.sv-stage-name'), list: [...el.querySelectorAll('.sv-stage-list button')],
    steps: [...el.querySelectorAll('.sv-step')],
  };
  const stages = dom.steps.map((s) => s.dataset.stage);
  const panels = {};
  const notes = {};
  const bodies = {};
  const figures = {};
  for (const stage of stages) {
    const panel = q(`.sv-panel[data-panel="${stage}"]`);
    panels[stage] = panel;
    notes[stage] = html('p', { cls: 'sv-empty', parent: panel });
    bodies[stage] = html('div', { cls: 'sv-body', parent: panel });
    figures[stage] = MODULES[stage].mount(bodies[stage]);
  }
  ctx = { el, dom, figure, stages, panels, notes, bodies, figures, index: 0, recorded: undefined, offered: undefined,
    live: {}, showLive: new Set(), running: null, anchored: false };
  figure.onDestroy(() => {
    for (const f of Object.values(ctx.figures)) f.destroy();
    ctx = null;
  });
  drawAll();

  const { listen } = figure;
  listen(dom.prev, 'click', () => jump(ctx.index - 1));
  listen(dom.next, 'click', () => jump(ctx.index + 1));
  listen(dom.run, 'click', runLive);
  listen(dom.back, 'click', showRecorded);
  dom.list.forEach((b) => listen(b, 'click', () => jump(stages.indexOf(b.dataset.stage))));
  listen(dom.sticky, 'keydown', onKey);
  listen(window, 'hashchange', () => { const i = stageFromHash(); if (i >= 0) jump(i); });
  listen(document, 'kvscope:model', (e) => updateButtons(e.detail));
  figure.onDestroy(observeSteps(dom.steps, onScrolledTo));

  const linked = stageFromHash();
  if (linked >= 0) { ctx.anchored = true; setStage(linked, { scroll: true }); }
  loadRecorded();
  loadOffer();
  figure.onDestroy(invariance.mount(q('.sv-invariance')).destroy); // its own section, recording and controls
});
