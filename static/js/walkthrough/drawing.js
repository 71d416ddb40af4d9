// Draws a figure state (stages.js) into the walkthrough's <figure>: the SVG lanes, the caption lines,
// the panel (messages, rendered prompt, token pieces, candidates or the answer) and the measured
// timeline strip. Elements are kept and updated in place; model text goes in with textContent only.
import { finder, html, setAttrs, svgEl } from '../shared/dom.js';
import { formatInt, formatMs, formatSize } from '../shared/format.js';
import { W, H, LANES, messageCards, tokenGrid, cacheColumns, queueSlot, decodeTick, timelineBoxes } from './layout.js';
import { STAGES, readout, endSentence, answerComplete } from './stages.js';
import { recordedOn, runRoute } from './context.js';

const LANE_NAMES = ['messages', 'prompt', 'queue', 'model', 'cache'];
const PANEL_TITLES = { messages: 'Messages', rendered: 'Rendered prompt (template markers in grey)',
  tokens: 'Token pieces', candidates: 'First token: the top candidates', answer: 'Answer' };

// Grows or shrinks a group to n children; new children come from make(i) and carry `is-new` so CSS can
// fade them in (no animation under prefers-reduced-motion).
function sync(group, n, make) {
  const kids = group.children;
  while (kids.length > n) group.lastElementChild.remove();
  const fresh = kids.length;
  for (let i = kids.length; i < n; i += 1) group.appendChild(make(i));
  for (let i = 0; i < kids.length; i += 1) kids[i].classList.toggle('is-new', i >= fresh);
  return kids;
}

// Token text as a chip shows it: line breaks visible, nothing else changed.
export const chipText = (text) => text.replace(/\n/g, '↵');

// [what the figure shows, details, provenance tag]
function sourceLine(state, run) {
  const m = run.model;
  const when = run.recordedAt ? run.recordedAt.slice(0, 10) : '';
  // The route (int4, int8, float32, …) sets every time in the run: it is named beside the model.
  const route = runRoute(run);
  // A recording names its machine as the intro does (recorded_on.machine); a live run the server's device.
  const { machine, decoder } = recordedOn(run);
  const on = (state.source === 'recorded' && machine) || m.device_name || m.device || '?';
  const where = m.name ? `${m.name}${route ? `, ${route} weights,` : ''} on ${on}` : '';
  switch (state.source) {
    // a recording names the decoder its steps ran on: the same model runs at another speed on the other
    case 'recorded': return ['Recorded run', ` · ${where}, ${decoder} · ${when}${loadNote(run)}`, 'measured'];
    case 'live': return [run.end ? 'Live run' : 'Live run, events arriving', ` · ${where}`, 'measured'];
    case 'imported': return ['Run from the lab', ` · ${where} · ${when}`, run.measured ? 'measured' : 'schematic'];
    case 'loading': return ['Loading the recorded run…', '', 'schematic'];
    default: return ['Schematic', ` · ${run.note || 'shapes only'}`, 'schematic'];
  }
}

// The load while it recorded (context.js reads either field naming): other work on the CPUs stretches
// every time in the run. The machine is named once, in `where`.
function loadNote(run) {
  const { load } = recordedOn(run);
  return load ? `, load ${load}` : '';
}

export function createDrawing(figureEl) {
  const q = finder(figureEl);
  const el = {
    source: q('.wt-source-text'), sourceDetail: q('.wt-source-detail'), sourceTag: q('.wt-source-tag'),
    num: q('.wt-stage-num'), name: q('.wt-stage-name'),
    readout: q('.wt-readout'), panel: q('.wt-panel'), panelTitle: q('.wt-panel-title'), panelBody: q('.wt-panel-body'),
    bar: q('.wt-timeline-bar'), legend: q('.wt-timeline-legend'),
  };
  const root = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, class: 'wt-svg', role: 'img', 'aria-labelledby': 'wt-svg-title' });
  const title = svgEl('title', { id: 'wt-svg-title' }, { parent: root });
  const lanes = {};
  const labels = {};
  for (const name of LANE_NAMES) {
    lanes[name] = svgEl('g', { class: 'wt-lane', 'data-lane': name }, { parent: root });
    const x = name === 'model' ? LANES.model.x : 0;
    labels[name] = svgEl('text', { class: 'wt-lane-label', x, y: LANES[name].label }, { parent: lanes[name] });
  }
  const cards = svgEl('g', { class: 'wt-cards' }, { parent: lanes.messages });
  const cells = svgEl('g', { class: 'wt-cells' }, { parent: lanes.prompt });
  const { queue: ql, model: ml } = LANES;
  svgEl('rect', { class: 'wt-box', x: ql.x, y: ql.top, width: ql.width, height: ql.height, rx: 4 }, { parent: lanes.queue });
  const slots = [1, 2, 3].map((k) => svgEl('rect', { class: 'wt-slot', ...queueSlot(k), rx: 3 }, { parent: lanes.queue }));
  const request = svgEl('rect', { class: 'wt-request', rx: 3, ...queueSlot(1) }, { parent: lanes.queue });
  svgEl('rect', { class: 'wt-box', x: ml.x, y: ml.top, width: ml.width, height: ml.height, rx: 4 }, { parent: lanes.model });
  const prefillFill = svgEl('rect', { class: 'wt-prefill', x: ml.x + 2, y: ml.top + 2, width: ml.width - 4, height: 13, rx: 3 }, { parent: lanes.model });
  const prefillText = svgEl('text', { class: 'wt-bar-text', x: ml.x + 6, y: ml.top + 11.5 }, { parent: lanes.model });
  const ticks = svgEl('g', { class: 'wt-ticks' }, { parent: lanes.model });
  const { cache: cl } = LANES;
  svgEl('rect', { class: 'wt-box', x: 0, y: cl.top, width: W, height: cl.height, rx: 2 }, { parent: lanes.cache });
  const columns = svgEl('g', { class: 'wt-columns' }, { parent: lanes.cache });
  q('.wt-svg-slot').appendChild(root);

  function drawMessages(state) {
    const boxes = messageCards(state.messages.items.length);
    cards.classList.toggle('is-merged', state.messages.dim);
    const kids = sync(cards, boxes.length, () => {
      const g = svgEl('g', { class: 'wt-card' });
      svgEl('rect', { rx: 4 }, { parent: g });
      svgEl('text', { class: 'wt-card-role' }, { parent: g });
      svgEl('text', { class: 'wt-card-count' }, { parent: g });
      return g;
    });
    state.messages.items.forEach((item, i) => {
      const b = boxes[i];
      const [rect, role, count] = kids[i].children;
      kids[i].setAttribute('class', `wt-card role-${item.role}`);
      setAttrs(rect, { x: b.x, y: b.y, width: b.width, height: b.height });
      setAttrs(role, { x: b.x + 4, y: b.y + 12 });
      setAttrs(count, { x: b.x + 4, y: b.y + 23 });
      role.textContent = item.label;
      count.textContent = `${item.tokens} tok`;
    });
    labels.messages.textContent = `messages: ${state.messages.items.length}`;
  }

  function drawTokens(state, run) {
    const P = state.prompt.sources.length;
    const grid = tokenGrid(P + Math.max(run.maxNewTokens, run.tokens.length));
    const n = state.prompt.shown ? P + state.generated : 0;
    const hl = new Set(state.prompt.highlight);
    const kids = sync(cells, n, () => svgEl('rect'));
    for (let i = 0; i < n; i += 1) {
      const { x, y } = grid.at(i);
      const kind = i < P ? `src-${state.prompt.sources[i]}` : 'gen';
      setAttrs(kids[i], { x, y, width: grid.cell, height: grid.cell, rx: Math.min(1.5, grid.cell / 4),
        class: `wt-cell ${kind}${hl.has(i) ? ' is-hl' : ''}${kids[i].classList.contains('is-new') ? ' is-new' : ''}` });
    }
    labels.prompt.textContent = state.prompt.shown
      ? `tokens: ${formatInt(P)} in the prompt${state.generated ? ` + ${state.generated} generated` : ''}`
      : 'tokens: not tokenized yet';
  }

  function drawQueue(state) {
    const qs = state.queue;
    request.classList.toggle('is-hidden', qs.state !== 'waiting');
    if (qs.state === 'waiting') setAttrs(request, queueSlot(qs.position || 1));
    // Slots nearer the model than ours hold the requests queued ahead of it.
    slots.forEach((slot, k) => slot.classList.toggle('is-taken', qs.state === 'waiting' && k + 1 < qs.position));
    labels.queue.textContent = qs.state === 'waiting' ? `queue: #${qs.position}`
      : qs.state === 'left' ? `queue: ${formatMs(qs.waitMs)}` : 'queue';
  }

  function drawModel(state, run) {
    const p = state.prefill;
    prefillFill.classList.toggle('is-done', p.state === 'done');
    prefillFill.classList.toggle('is-running', p.state === 'running');
    prefillText.textContent = p.state === 'done' ? `prefill: ${formatInt(p.tokens)} tokens, one pass · ${formatMs(p.ms)}`
      : p.state === 'running' ? `prefill: ${formatInt(p.tokens)} tokens…` : '';
    const maxSteps = Math.max(run.maxNewTokens - 1, run.tokens.length - 1, 1);
    const kids = sync(ticks, state.decodeSteps, () => svgEl('rect', { class: 'wt-tick' }));
    for (let k = 0; k < state.decodeSteps; k += 1) setAttrs(kids[k], decodeTick(k, maxSteps));
    labels.model.textContent = state.decodeSteps ? `model: prefill, then ${state.decodeSteps} decode steps`
      : p.state === 'idle' ? 'model: idle' : 'model: prefill';
  }

  function drawCache(state, run) {
    const c = state.cache;
    const geo = cacheColumns(c.capacity);
    const kids = sync(columns, c.columns, () => svgEl('rect'));
    for (let i = 0; i < c.columns; i += 1) {
      const { x, y, height } = geo.at(i);
      setAttrs(kids[i], { x, y, height, width: Math.max(geo.width - geo.gap, 0.4),
        class: `wt-col ${i < c.promptColumns ? 'prompt' : 'gen'}${kids[i].classList.contains('is-new') ? ' is-new' : ''}` });
    }
    labels.cache.textContent = c.columns ? `KV cache: ${formatInt(c.columns)} positions × all layers · ${formatSize(c.bytes)}`
      : run?.model?.engine === 'openai' ? 'KV cache: not visible from outside the server' : 'KV cache: empty';
  }

  function drawReadout(state, run) {
    el.readout.replaceChildren();
    for (const line of readout(state, run)) {
      const li = html('li', { text: line.text, parent: el.readout });
      if (line.tag) li.dataset.provenance = line.tag;
      if (line.tag) html('span', { cls: `tag tag-${line.tag}`, text: line.tag, parent: li });
    }
  }

  function drawPanel(state, run) {
    const body = el.panelBody;
    el.panelTitle.textContent = PANEL_TITLES[state.panel];
    el.panel.dataset.kind = state.panel;
    body.replaceChildren();
    if (state.panel === 'messages') {
      for (const m of run.messages) {
        const p = html('p', { cls: `wt-msg role-${m.role}`, parent: body });
        html('strong', { text: `${m.role}: `, parent: p });
        html('span', { text: m.content, parent: p });
      }
    } else if (state.panel === 'rendered' || state.panel === 'tokens') {
      const hl = new Set(state.prompt.highlight);
      const cls = state.panel === 'tokens' ? 'wt-chip' : 'wt-piece';
      run.prompt.tokens.forEach((t, i) => {
        const text = state.panel === 'tokens' ? chipText(t.text) : t.text;
        html('span', { cls: `${cls} src-${t.source}${hl.has(i) ? ' is-hl' : ''}`, text, parent: body });
      });
    } else {
      if (state.output.candidates) drawCandidates(body, state.output.candidates);
      drawAnswer(body, state);
    }
  }

  function drawCandidates(body, candidates) {
    const list = html('ol', { cls: 'wt-cands', parent: body });
    for (const c of candidates) {
      const li = html('li', { parent: list });
      html('code', { text: JSON.stringify(c.text), parent: li });
      const bar = html('span', { cls: 'wt-cand-bar', parent: li });
      bar.style.width = `${Math.round(c.prob * 100)}%`;
      html('span', { cls: 'wt-cand-p', text: c.prob.toFixed(2), parent: li });
    }
  }

  function drawAnswer(body, state) {
    const out = html('p', { cls: `wt-answer${state.output.boundaries ? ' show-bounds' : ''}`, parent: body });
    if (!state.output.tokens.length) html('span', { cls: 'wt-empty', text: 'nothing yet: the answer starts when prefill ends', parent: out });
    for (const t of state.output.tokens) html('span', { cls: `wt-tok${t.pending ? ' pending' : ''}`, text: t.text, parent: out });
    if (state.end) html('p', { cls: `wt-end ${answerComplete(state.end) ? 'complete' : 'incomplete'}`, text: endSentence(state.end), parent: body });
  }

  function drawTimeline(state, run) {
    const boxes = timelineBoxes(run.timeline);
    el.bar.replaceChildren();
    el.bar.classList.toggle('has-hl', state.timeline !== null);
    for (const b of boxes) {
      const seg = html('span', { cls: `wt-seg ${b.kind}`, parent: el.bar });
      seg.style.left = `${(b.left * 100).toFixed(3)}%`;
      seg.style.width = `${(b.width * 100).toFixed(3)}%`;
      seg.title = b.kind === 'decode' ? `decode step ${b.index}: ${formatMs(b.ms)}` : `${b.kind}: ${formatMs(b.ms)}`;
      seg.classList.toggle('is-hl', state.timeline === 'all' || state.timeline === b.kind);
    }
    el.legend.replaceChildren();
    if (!boxes.length) {
      html('span', { text: run.measured ? 'timeline: no steps yet' : 'no measured times in a schematic run ', parent: el.legend });
      if (!run.measured) html('span', { cls: 'tag tag-schematic', text: 'schematic', parent: el.legend });
      return;
    }
    const sum = (kind) => boxes.filter((b) => b.kind === kind).reduce((a, b) => a + b.ms, 0);
    const steps = boxes.filter((b) => b.kind === 'decode').length;
    // A remote engine (kvscope serve --engine) cannot see queue vs prefill: say so rather than draw 0 ms.
    const split = boxes.some((b) => b.kind === 'queue' || b.kind === 'prefill') || run.model?.engine !== 'openai';
    const parts = [...(split ? [['queue', `queue ${formatMs(sum('queue'))}`], ['prefill', `prefill ${formatMs(sum('prefill'))}`]]
      : [['prefill', 'queue and prefill: not visible from outside the server']]),
    ['decode', `decode ${steps} steps, ${formatMs(sum('decode'))}`]];
    for (const [kind, text] of parts) html('span', { cls: `wt-leg ${kind}`, text, parent: el.legend });
    html('span', { cls: `tag tag-${run.measured ? 'measured' : 'schematic'}`, text: run.measured ? 'measured' : 'schematic', parent: el.legend });
  }

  function render(state, run) {
    figureEl.dataset.stage = state.name;
    figureEl.dataset.source = state.source;
    const [kind, detail, tag] = sourceLine(state, run);
    el.source.textContent = kind;
    el.sourceDetail.textContent = detail;
    el.sourceTag.textContent = tag;
    el.sourceTag.className = `wt-source-tag tag tag-${tag}`;
    // Provenance of everything the figure draws from the run on display (the provenance walk reads it).
    const prov = run.measured ? 'measured' : 'schematic';
    el.source.parentElement.dataset.provenance = tag;
    for (const part of [el.panel, el.legend, figureEl.querySelector('.wt-svg-slot')]) if (part) part.dataset.provenance = prov;
    el.num.textContent = `${state.index + 1}/${STAGES.length}`;
    el.name.textContent = state.title;
    for (const name of LANE_NAMES) {
      lanes[name].classList.toggle('is-focus', state.focus === name);
      lanes[name].classList.toggle('is-dim', state.focus !== null && state.focus !== name);
    }
    el.panel.classList.toggle('is-focus', state.focus === 'panel');
    drawMessages(state);
    drawTokens(state, run);
    drawQueue(state);
    drawModel(state, run);
    drawCache(state, run);
    drawReadout(state, run);
    drawPanel(state, run);
    drawTimeline(state, run);
    title.textContent = `Stage ${state.index + 1} of ${STAGES.length}, ${state.title}. ${readout(state, run).map((l) => l.text).join('. ')}`;
  }

  return { render, destroy: () => root.remove() };
}
