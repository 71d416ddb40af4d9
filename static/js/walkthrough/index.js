// The walkthrough figure. mount(el) loads the recorded trace, shows the stage the reader has scrolled
// to, and wires the controls, `#stage-…` deep links, live runs ("Run it for real") and the lab's
// `kvscope:replay-trace` event; destroy() undoes all of it (shared/figure.js: every listener, the
// play timer and the fetches go through one `figure` handle). The state shown is always
// figureState(stage index, run): nothing accumulates, so going back restores a stage exactly. The
// decode and cache stages also show what the newest token read (attention.js), from the trace on display.
import { parseTrace, deriveRun, makeTrace } from '../trace.js';
import { runRequest } from '../ws-client.js';
import { currentModel } from '../model-status.js';
import { defineFigure } from '../shared/figure.js';
import { finder } from '../shared/dom.js';
import { MISSING, formatMs } from '../shared/format.js';
import { EVENT, isConnectionLost } from '../shared/protocol.js';
import {
  STAGES, LAST, stageIndex, clampStage, stageForPhase, figureState, storyFacts, factProvenance, schematicRun,
} from './stages.js';
import { contextFacts } from './context.js';
import { createDrawing } from './drawing.js';
import { loadTrace as loadServingTrace } from '../shared/serving-trace.js';
import { observeSteps, scrollToStep } from '../shared/scroll.js';
import { createAttentionBlock, liveRequest } from './attention.js';

const TRACE_URL = new URL('../../data/trace-example.json', import.meta.url);
const PLAY_EVERY_MS = 4000;
const NEXT_KEYS = new Set(['ArrowRight', 'ArrowDown', 'PageDown']);
const PREV_KEYS = new Set(['ArrowLeft', 'ArrowUp', 'PageUp']);

let ctx = null; // the mounted walkthrough's state; null once destroyed, which async work checks

function render() {
  const { index, run, source, dom } = ctx;
  const state = figureState(index, run, source);
  ctx.drawing.render(state, run);
  ctx.attention.update(ctx.trace, state, run);
  dom.list.forEach((b, i) => (i === index ? b.setAttribute('aria-current', 'step') : b.removeAttribute('aria-current')));
  dom.steps.forEach((s, i) => s.classList.toggle('is-active', i === index));
  dom.prev.disabled = index === 0;
  dom.next.disabled = index === LAST;
}

function showFacts() {
  const facts = storyFacts(ctx.run);
  for (const node of ctx.el.querySelectorAll('[data-fact]')) {
    node.textContent = facts[node.dataset.fact] ?? MISSING;
    const provenance = factProvenance(node.dataset.fact, ctx.run);
    // a setting (the model's configuration, the request's own choices) is an input, not a finding
    if (provenance === 'setting') {
      node.dataset.setting = '';
      delete node.dataset.provenance;
    } else {
      node.dataset.provenance = provenance;
      delete node.dataset.setting;
    }
  }
  const prov = ctx.run.measured ? 'measured' : 'schematic';
  for (const tag of ctx.el.querySelectorAll('[data-prov]')) {
    tag.className = `tag tag-${prov}`;
    tag.textContent = prov;
  }
  showContext();
}

// The facts that set the run beside the serving chapter's recording (context.js); a sentence whose
// data is missing is hidden rather than shown with blanks.
function showContext() {
  if (ctx.recorded && !ctx.recordedRun) ctx.recordedRun = deriveRun(ctx.recorded);
  const { facts, hidden } = contextFacts(ctx.run, ctx.serving, ctx.recordedRun);
  for (const node of ctx.el.querySelectorAll('[data-ctx]')) {
    const [text, provenance] = facts[node.dataset.ctx] || [MISSING, 'schematic'];
    node.textContent = text;
    if (provenance === 'setting') { // a count or name the recording was given, not a finding
      node.dataset.setting = '';
      delete node.dataset.provenance;
    } else {
      node.dataset.provenance = provenance;
      delete node.dataset.setting;
    }
  }
  for (const node of ctx.el.querySelectorAll('[data-ctx-sentence]')) node.hidden = hidden.includes(node.dataset.ctxSentence);
}

// The serving chapter's recording, for the roofline and pricing facts; without it those sentences hide.
async function loadServing() {
  try {
    ctx.serving = await loadServingTrace(ctx.figure.signal);
  } catch {
    if (!ctx) return;
    ctx.serving = null;
  }
  if (!ctx) return;
  showContext();
  if (ctx.anchored) scrollToStep(ctx.dom.steps[ctx.index]);
}

// trace: the events behind `run` (null for the schematic stand-in), for what each token read.
function setRun(run, source, trace = null) {
  ctx.run = run;
  ctx.source = source;
  ctx.trace = trace;
  showFacts();
  render();
}

// Moves to a stage. `scroll` brings its story step to the reading line; `hash` records a deep link.
function setStage(i, { scroll = false, hash = false } = {}) {
  const index = clampStage(i);
  const changed = index !== ctx.index;
  ctx.index = index;
  if (changed) {
    render();
    // For observers outside the figure (static/js/class-follow.js: the teacher's stage broadcast).
    ctx.el.dispatchEvent(new CustomEvent('kvscope:stage', { bubbles: true, detail: { stage: STAGES[index].name } }));
  }
  if (scroll) {
    ctx.anchored = true;
    scrollToStep(ctx.dom.steps[index]);
  }
  if (hash) history.replaceState(null, '', `#stage-${STAGES[index].name}`);
}

// A stage chosen with the controls: stops auto-play and event-following, scrolls the story along.
function jump(i) {
  stopPlay();
  ctx.follow = false;
  setStage(i, { scroll: true, hash: true });
}

function onScrolledTo(i) {
  if (i === ctx.index) return;
  // The reader scrolled somewhere else: stop steering the page.
  stopPlay();
  ctx.follow = false;
  ctx.anchored = false;
  setStage(i);
}

// ---- play / pause --------------------------------------------------------------------------------

function stopPlay() {
  ctx.figure.cancelTimeout(ctx.playTimer);
  ctx.playTimer = null;
  ctx.dom.play.setAttribute('aria-pressed', 'false');
  ctx.dom.play.textContent = 'Play';
}

function tick() {
  if (ctx.index >= LAST) { stopPlay(); return; }
  setStage(ctx.index + 1, { scroll: true });
  ctx.playTimer = ctx.figure.timeout(tick, PLAY_EVERY_MS);
}

function togglePlay() {
  if (ctx.playTimer) { stopPlay(); return; }
  ctx.dom.play.setAttribute('aria-pressed', 'true');
  ctx.dom.play.textContent = 'Pause';
  if (ctx.index >= LAST) setStage(0, { scroll: true });
  ctx.playTimer = ctx.figure.timeout(tick, PLAY_EVERY_MS);
}

// ---- sources: recorded trace, live run, a run from the lab ---------------------------------------

function say(text) {
  ctx.dom.status.textContent = text;
}

async function loadRecorded() {
  try {
    const res = await fetch(TRACE_URL, { signal: ctx.figure.signal });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const trace = parseTrace(await res.json());
    if (!ctx) return;
    ctx.recorded = trace;
    if (ctx.source === 'loading') setRun(deriveRun(trace), trace.synthetic ? 'schematic' : 'recorded', trace);
    // The real numbers change the prose's length: keep a linked or chosen stage at the reading line.
    if (ctx.anchored) scrollToStep(ctx.dom.steps[ctx.index]);
    updateRunButton();
  } catch (err) {
    if (!ctx) return;
    if (ctx.source === 'loading') setRun(ctx.run, 'schematic');
    say(`The recorded run could not be loaded (${err.message}); the figure shows schematic shapes.`);
  }
}

async function modelFacts() {
  const known = currentModel();
  if (known && known.facts) return known.facts;
  const res = await fetch('/api/model', { signal: ctx.figure.signal });
  return (await res.json()).facts || {};
}

// The rendered prompt of the example, from the running model's tokenizer. The recorded trace holds
// the same request, so its prompt stands in if /api/prompt cannot answer.
async function promptFor(request) {
  const { recorded, figure } = ctx;
  try {
    const res = await fetch('/api/prompt', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(request), signal: figure.signal,
    });
    if (res.ok) return await res.json();
  } catch { /* fall through to the recorded prompt */ }
  return recorded.prompt;
}

function onLiveEvent(trace, event) {
  if (ctx.live !== trace) return;
  trace.events.push(event);
  const run = deriveRun(trace);
  ctx.run = run;
  if (event.type === EVENT.QUEUED) say(`Live run: queued at position ${event.position} (${event.ahead} ahead).`);
  if (event.type === EVENT.PREFILL_START) say('Live run: prefill…');
  if (event.type === EVENT.TOKEN) say(`Live run: ${run.tokens.length} tokens…`);
  const before = ctx.index;
  // An event without a phase of its own (an `attention` frame comes just before its token) keeps the stage.
  if (ctx.follow && run.phase) setStage(stageForPhase(run.phase), { scroll: true });
  if (ctx.index === before) render();
}

async function runLive() {
  if (ctx.handle || !ctx.recorded) return;
  const { dom } = ctx;
  stopPlay();
  dom.run.disabled = true;
  say('Live run: starting…');
  let model;
  let request;
  let prompt;
  try {
    model = await modelFacts();
    request = liveRequest(ctx.recorded.request, model); // with what each new token read, where visible
    prompt = await promptFor(request);
  } catch (err) {
    if (!ctx) return;
    say(`Live run: the server did not answer (${err.message}).`);
    updateRunButton();
    return;
  }
  if (!ctx) return;
  const trace = makeTrace({ model, request, prompt, events: [] });
  ctx.live = trace;
  ctx.follow = true;
  setRun(deriveRun(trace), 'live', trace);
  dom.stop.hidden = false;
  dom.back.hidden = true;
  ctx.handle = runRequest(request, { onEvent: (ev) => onLiveEvent(trace, ev) });
  const last = await ctx.handle.done;
  if (!ctx || ctx.live !== trace) return;
  if (isConnectionLost(last)) onLiveEvent(trace, { ...last, t_ms: lastTime(trace) });
  ctx.handle = null;
  ctx.follow = false;
  dom.stop.hidden = true;
  dom.back.hidden = false;
  updateRunButton();
  setRun(deriveRun(trace), 'live', trace);
  say(last.type === EVENT.FINISHED ? `Live run finished (${last.reason}) in ${formatMs(last.t_ms)}.`
    : `Live run ended early: ${last.type === EVENT.ERROR ? last.message : 'cancelled'}. The answer is incomplete.`);
}

const lastTime = (trace) => (trace.events.length ? trace.events[trace.events.length - 1].t_ms : 0);

function stopLive() {
  if (ctx.handle) ctx.handle.cancel();
}

function showRecorded() {
  if (!ctx.recorded || ctx.handle) return;
  ctx.live = null;
  ctx.dom.back.hidden = true;
  say('');
  setRun(deriveRun(ctx.recorded), ctx.recorded.synthetic ? 'schematic' : 'recorded', ctx.recorded);
}

function onReplayTrace(event) {
  if (ctx.handle) { say('A live run is in progress; the lab run will show when it ends.'); return; }
  try {
    const trace = parseTrace(event.detail);
    ctx.live = null;
    stopPlay();
    ctx.follow = false;
    setRun(deriveRun(trace), 'imported', trace);
    ctx.dom.back.hidden = false;
    say(`Showing a run from the lab (${trace.events.length} events).`);
    setStage(LAST, { scroll: true });
  } catch (err) {
    say(`Could not show that run: ${err.message}`);
  }
}

function updateRunButton(info = currentModel()) {
  const ready = !!(info && info.status === 'ready');
  ctx.dom.run.disabled = !ready || !ctx.recorded || !!ctx.handle;
  ctx.dom.run.title = ready ? 'Send the example request to the model now' : 'Waiting for the model to load';
}

// ---- wiring ----------------------------------------------------------------------------------------

function onKey(event) {
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  if (event.target.closest('input')) return; // the layer slider's own arrows, Home and End
  let target = null;
  if (NEXT_KEYS.has(event.key)) target = ctx.index + 1;
  else if (PREV_KEYS.has(event.key)) target = ctx.index - 1;
  else if (event.key === 'Home') target = 0;
  else if (event.key === 'End') target = LAST;
  if (target === null) return;
  event.preventDefault();
  jump(target);
}

function stageFromHash() {
  const m = /^#stage-([a-z-]+)$/.exec(location.hash);
  return m ? stageIndex(m[1]) : -1;
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const dom = {
    figure: q('.wt-figure'), sticky: q('.wt-sticky'), prev: q('.wt-prev'), next: q('.wt-next'), play: q('.wt-play'),
    run: q('.wt-run'), stop: q('.wt-stop'), back: q('.wt-back'), status: q('.wt-run-status'),
    list: [...el.querySelectorAll('.wt-stage-list button')], steps: [...el.querySelectorAll('.wt-step')],
  };
  ctx = { el, dom, figure, index: 0, run: schematicRun(), source: 'loading', trace: null, recorded: null,
    recordedRun: null, serving: null, live: null, handle: null, follow: false, anchored: false, playTimer: 0 };
  ctx.drawing = createDrawing(dom.figure);
  const marks = (sel) => [...dom.figure.querySelectorAll(sel)];
  ctx.attention = createAttentionBlock(q('.wt-attn'), figure, () => [marks('.wt-cells .wt-cell'), marks('.wt-columns .wt-col')]);
  // Runs last on destroy (after the listeners and the play timer are gone): the live run is
  // cancelled, the SVG removed, and `ctx = null` tells pending async work to stop.
  figure.onDestroy(() => {
    stopPlay();
    if (ctx.handle) ctx.handle.cancel();
    ctx.drawing.destroy();
    ctx = null;
  });
  showFacts();
  render();

  const { listen } = figure;
  listen(dom.prev, 'click', () => jump(ctx.index - 1));
  listen(dom.next, 'click', () => jump(ctx.index + 1));
  listen(dom.play, 'click', togglePlay);
  listen(dom.run, 'click', runLive);
  listen(dom.stop, 'click', stopLive);
  listen(dom.back, 'click', showRecorded);
  dom.list.forEach((b) => listen(b, 'click', () => jump(stageIndex(b.dataset.stage))));
  listen(dom.sticky, 'keydown', onKey);
  listen(window, 'hashchange', () => { const i = stageFromHash(); if (i >= 0) jump(i); });
  listen(document, 'kvscope:model', (e) => updateRunButton(e.detail));
  listen(document, 'kvscope:replay-trace', onReplayTrace);
  // A stage chosen from outside, by name (class-follow.js: a student following the teacher).
  listen(document, 'kvscope:goto-stage', (e) => { const i = stageIndex(e.detail?.stage); if (i >= 0) jump(i); });
  figure.onDestroy(observeSteps(dom.steps, onScrolledTo));

  const linked = stageFromHash();
  if (linked >= 0) setStage(linked, { scroll: true });
  updateRunButton();
  loadRecorded();
  loadServing();
});
