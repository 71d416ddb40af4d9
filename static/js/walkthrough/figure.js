// Draws a figure state (stages.js) into the walkthrough's <figure>: the SVG lanes, the caption lines,
// the panel (messages, rendered prompt, token pieces, candidates or the answer) and the measured
// timeline strip. Elements are kept and updated in place; model text goes in with textContent only.
import { W, H, LANES, messageCards, tokenGrid, cacheColumns, queueSlot, decodeTick, timelineBoxes } from './layout.js';
import { STAGES, readout, fmtMs, fmtBytes, fmtInt, endSentence, answerComplete } from './stages.js';

const SVG_NS = 'http://www.w3.org/2000/svg';
const LANE_NAMES = ['messages', 'prompt', 'queue', 'model', 'cache'];
const PANEL_TITLES = { messages: 'Messages', rendered: 'Rendered prompt (template markers in grey)',
  tokens: 'Token pieces', candidates: 'First token: the top candidates', answer: 'Answer' };

function svg(tag, attrs, parent) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, cls, text, parent) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
}

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
  const where = m.name ? `${m.name} on ${m.device_name || m.device || '?'}` : '';
  switch (state.source) {
    case 'recorded': return ['Recorded run', ` · ${where} · ${when}`, 'measured'];
    case 'live': return [run.end ? 'Live run' : 'Live run, events arriving', ` · ${where}`, 'measured'];
    case 'imported': return ['Run from the lab', ` · ${where} · ${when}`, run.measured ? 'measured' : 'schematic'];
    case 'loading': return ['Loading the recorded run…', '', 'schematic'];
    default: return ['Schematic', ` · ${run.note || 'shapes only'}`, 'schematic'];
  }
}

export function createFigure(figureEl) {
  const q = (sel) => figureEl.querySelector(sel);
  const el = {
    source: q('.wt-source-text'), sourceDetail: q('.wt-source-detail'), sourceTag: q('.wt-source-tag'),
    num: q('.wt-stage-num'), name: q('.wt-stage-name'),
    readout: q('.wt-readout'), panel: q('.wt-panel'), panelTitle: q('.wt-panel-title'), panelBody: q('.wt-panel-body'),
    bar: q('.wt-timeline-bar'), legend: q('.wt-timeline-legend'),
  };
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'wt-svg', role: 'img', 'aria-labelledby': 'wt-svg-title' });
  const title = svg('title', { id: 'wt-svg-title' }, root);
  const lanes = {};
  const labels = {};
  for (const name of LANE_NAMES) {
    lanes[name] = svg('g', { class: 'wt-lane', 'data-lane': name }, root);
    const x = name === 'model' ? LANES.model.x : 0;
    labels[name] = svg('text', { class: 'wt-lane-label', x, y: LANES[name].label }, lanes[name]);
  }
  const cards = svg('g', { class: 'wt-cards' }, lanes.messages);
  const cells = svg('g', { class: 'wt-cells' }, lanes.prompt);
  const { queue: ql, model: ml } = LANES;
  svg('rect', { class: 'wt-box', x: ql.x, y: ql.top, width: ql.width, height: ql.height, rx: 4 }, lanes.queue);
  const slots = [1, 2, 3].map((k) => svg('rect', { class: 'wt-slot', ...queueSlot(k), rx: 3 }, lanes.queue));
  const request = svg('rect', { class: 'wt-request', rx: 3, ...queueSlot(1) }, lanes.queue);
  svg('rect', { class: 'wt-box', x: ml.x, y: ml.top, width: ml.width, height: ml.height, rx: 4 }, lanes.model);
  const prefillFill = svg('rect', { class: 'wt-prefill', x: ml.x + 2, y: ml.top + 2, width: ml.width - 4, height: 13, rx: 3 }, lanes.model);
  const prefillText = svg('text', { class: 'wt-bar-text', x: ml.x + 6, y: ml.top + 11.5 }, lanes.model);
  const ticks = svg('g', { class: 'wt-ticks' }, lanes.model);
  const { cache: cl } = LANES;
  svg('rect', { class: 'wt-box', x: 0, y: cl.top, width: W, height: cl.height, rx: 2 }, lanes.cache);
  const columns = svg('g', { class: 'wt-columns' }, lanes.cache);
  q('.wt-svg-slot').appendChild(root);

  function drawMessages(state) {
    const boxes = messageCards(state.messages.items.length);
    cards.classList.toggle('is-merged', state.messages.dim);
    const kids = sync(cards, boxes.length, () => {
      const g = svg('g', { class: 'wt-card' });
      svg('rect', { rx: 4 }, g);
      svg('text', { class: 'wt-card-role' }, g);
      svg('text', { class: 'wt-card-count' }, g);
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
    const kids = sync(cells, n, () => svg('rect', {}));
    for (let i = 0; i < n; i += 1) {
      const { x, y } = grid.at(i);
      const kind = i < P ? `src-${state.prompt.sources[i]}` : 'gen';
      setAttrs(kids[i], { x, y, width: grid.cell, height: grid.cell, rx: Math.min(1.5, grid.cell / 4),
        class: `wt-cell ${kind}${hl.has(i) ? ' is-hl' : ''}${kids[i].classList.contains('is-new') ? ' is-new' : ''}` });
    }
    labels.prompt.textContent = state.prompt.shown
      ? `tokens: ${fmtInt(P)} in the prompt${state.generated ? ` + ${state.generated} generated` : ''}`
      : 'tokens: not tokenized yet';
  }

  function drawQueue(state) {
    const qs = state.queue;
    request.classList.toggle('is-hidden', qs.state !== 'waiting');
    if (qs.state === 'waiting') setAttrs(request, queueSlot(qs.position || 1));
    // Slots nearer the model than ours hold the requests queued ahead of it.
    slots.forEach((slot, k) => slot.classList.toggle('is-taken', qs.state === 'waiting' && k + 1 < qs.position));
    labels.queue.textContent = qs.state === 'waiting' ? `queue: #${qs.position}`
      : qs.state === 'left' ? `queue: ${fmtMs(qs.waitMs)}` : 'queue';
  }

  function drawModel(state, run) {
    const p = state.prefill;
    prefillFill.classList.toggle('is-done', p.state === 'done');
    prefillFill.classList.toggle('is-running', p.state === 'running');
    prefillText.textContent = p.state === 'done' ? `prefill: ${fmtInt(p.tokens)} tokens, one pass · ${fmtMs(p.ms)}`
      : p.state === 'running' ? `prefill: ${fmtInt(p.tokens)} tokens…` : '';
    const maxSteps = Math.max(run.maxNewTokens - 1, run.tokens.length - 1, 1);
    const kids = sync(ticks, state.decodeSteps, () => svg('rect', { class: 'wt-tick' }));
    for (let k = 0; k < state.decodeSteps; k += 1) setAttrs(kids[k], decodeTick(k, maxSteps));
    labels.model.textContent = state.decodeSteps ? `model: prefill, then ${state.decodeSteps} decode steps`
      : p.state === 'idle' ? 'model: idle' : 'model: prefill';
  }

  function drawCache(state) {
    const c = state.cache;
    const geo = cacheColumns(c.capacity);
    const kids = sync(columns, c.columns, () => svg('rect', {}));
    for (let i = 0; i < c.columns; i += 1) {
      const { x, y, height } = geo.at(i);
      setAttrs(kids[i], { x, y, height, width: Math.max(geo.width - geo.gap, 0.4),
        class: `wt-col ${i < c.promptColumns ? 'prompt' : 'gen'}${kids[i].classList.contains('is-new') ? ' is-new' : ''}` });
    }
    labels.cache.textContent = c.columns ? `KV cache: ${fmtInt(c.columns)} positions × all layers · ${fmtBytes(c.bytes)}`
      : 'KV cache: empty';
  }

  function drawReadout(state, run) {
    el.readout.replaceChildren();
    for (const line of readout(state, run)) {
      const li = html('li', null, line.text, el.readout);
      if (line.tag) html('span', `tag tag-${line.tag}`, line.tag, li);
    }
  }

  function drawPanel(state, run) {
    const body = el.panelBody;
    el.panelTitle.textContent = PANEL_TITLES[state.panel];
    el.panel.dataset.kind = state.panel;
    body.replaceChildren();
    if (state.panel === 'messages') {
      for (const m of run.messages) {
        const p = html('p', `wt-msg role-${m.role}`, null, body);
        html('strong', null, `${m.role}: `, p);
        html('span', null, m.content, p);
      }
    } else if (state.panel === 'rendered' || state.panel === 'tokens') {
      const hl = new Set(state.prompt.highlight);
      const cls = state.panel === 'tokens' ? 'wt-chip' : 'wt-piece';
      run.prompt.tokens.forEach((t, i) => {
        const text = state.panel === 'tokens' ? chipText(t.text) : t.text;
        html('span', `${cls} src-${t.source}${hl.has(i) ? ' is-hl' : ''}`, text, body);
      });
    } else {
      if (state.output.candidates) drawCandidates(body, state.output.candidates);
      drawAnswer(body, state);
    }
  }

  function drawCandidates(body, candidates) {
    const list = html('ol', 'wt-cands', null, body);
    for (const c of candidates) {
      const li = html('li', null, null, list);
      html('code', null, JSON.stringify(c.text), li);
      const bar = html('span', 'wt-cand-bar', null, li);
      bar.style.width = `${Math.round(c.prob * 100)}%`;
      html('span', 'wt-cand-p', c.prob.toFixed(2), li);
    }
  }

  function drawAnswer(body, state) {
    const out = html('p', `wt-answer${state.output.boundaries ? ' show-bounds' : ''}`, null, body);
    if (!state.output.tokens.length) html('span', 'wt-empty', 'nothing yet: the answer starts when prefill ends', out);
    for (const t of state.output.tokens) html('span', `wt-tok${t.pending ? ' pending' : ''}`, t.text, out);
    if (state.end) html('p', `wt-end ${answerComplete(state.end) ? 'complete' : 'incomplete'}`, endSentence(state.end), body);
  }

  function drawTimeline(state, run) {
    const boxes = timelineBoxes(run.timeline);
    el.bar.replaceChildren();
    el.bar.classList.toggle('has-hl', state.timeline !== null);
    for (const b of boxes) {
      const seg = html('span', `wt-seg ${b.kind}`, null, el.bar);
      seg.style.left = `${(b.left * 100).toFixed(3)}%`;
      seg.style.width = `${(b.width * 100).toFixed(3)}%`;
      seg.title = b.kind === 'decode' ? `decode step ${b.index}: ${fmtMs(b.ms)}` : `${b.kind}: ${fmtMs(b.ms)}`;
      seg.classList.toggle('is-hl', state.timeline === 'all' || state.timeline === b.kind);
    }
    el.legend.replaceChildren();
    if (!boxes.length) {
      html('span', null, run.measured ? 'timeline: no steps yet' : 'no measured times in a schematic run ', el.legend);
      if (!run.measured) html('span', 'tag tag-schematic', 'schematic', el.legend);
      return;
    }
    const sum = (kind) => boxes.filter((b) => b.kind === kind).reduce((a, b) => a + b.ms, 0);
    const steps = boxes.filter((b) => b.kind === 'decode').length;
    const parts = [['queue', `queue ${fmtMs(sum('queue'))}`], ['prefill', `prefill ${fmtMs(sum('prefill'))}`],
      ['decode', `decode ${steps} steps, ${fmtMs(sum('decode'))}`]];
    for (const [kind, text] of parts) html('span', `wt-leg ${kind}`, text, el.legend);
    html('span', `tag tag-${run.measured ? 'measured' : 'schematic'}`, run.measured ? 'measured' : 'schematic', el.legend);
  }

  function render(state, run) {
    figureEl.dataset.stage = state.name;
    figureEl.dataset.source = state.source;
    const [kind, detail, tag] = sourceLine(state, run);
    el.source.textContent = kind;
    el.sourceDetail.textContent = detail;
    el.sourceTag.textContent = tag;
    el.sourceTag.className = `wt-source-tag tag tag-${tag}`;
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
    drawCache(state);
    drawReadout(state, run);
    drawPanel(state, run);
    drawTimeline(state, run);
    title.textContent = `Stage ${state.index + 1} of ${STAGES.length}, ${state.title}. ${readout(state, run).map((l) => l.text).join('. ')}`;
  }

  return { render, destroy: () => root.remove() };
}
