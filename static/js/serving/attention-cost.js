// Stage 6 figure, "Attention is not free": one request's decode step time at a growing number of cached
// positions (the best and the median step of each length, measured), the straight line the server fitted
// through them (its intercept: a step with no cache), and the weights-only floor computed from the cost
// model's weight bytes over this machine's measured bandwidth; below, each length's figures.
import { html, svgEl } from '../shared/dom.js';
import { formatInt, formatMs, formatSize } from '../shared/format.js';
import { axes, clear, readouts, table, value } from './view.js';
import { chartModel, linearScale } from './attention-cost-math.js';

const W = 420;
const H = 230;
const M = { top: 14, right: 24, bottom: 36, left: 46 };

// A line with its label: the label's own provenance says how its number was made.
function labelledLine(svg, { cls, x1, y1, x2, y2, label, provenance, above = true }) {
  svgEl('line', { x1, y1, x2, y2, class: cls }, { parent: svg });
  svgEl('text', { x: x2 - 2, y: y2 + (above ? -5 : 12), class: 'sv-rlabel', 'text-anchor': 'end', 'data-provenance': provenance },
    { text: label, parent: svg });
}

function chart(parent, model) {
  const x = linearScale([0, model.xMax], [M.left, W - M.right]);
  const y = linearScale([0, model.yMax], [H - M.bottom, M.top]);
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, class: 'sv-attn-chart', role: 'img',
    'aria-label': 'Decode step time in milliseconds against the cached positions it reads' }, { parent });
  axes(svg, { W, H, M }, { x, y, xTicks: model.xTicks, yTicks: model.yTicks, xText: formatInt, yText: formatInt,
    xTitle: 'cached positions the new token reads', yTitle: 'decode step (ms)' });
  if (model.floor != null) {
    labelledLine(svg, { cls: 'sv-floor', x1: x(0), y1: y(model.floor), x2: x(model.xMax), y2: y(model.floor),
      label: `weights-only floor ${formatMs(model.floor)}, computed`, provenance: 'computed', above: false });
  }
  if (model.fit) {
    const f = model.fit;
    labelledLine(svg, { cls: 'sv-fit', x1: x(f.x0), y1: y(f.y0), x2: x(f.x1), y2: y(f.y1),
      label: `line fitted to the measured steps, computed: ${formatMs(f.y0)} at no cache`, provenance: 'computed' });
  }
  for (const p of model.points) {
    const g = svgEl('g', { class: 'sv-apoint', 'data-positions': p.positions, 'data-ms': p.best,
      transform: `translate(${x(p.positions)} ${y(p.best)})` }, { parent: svg });
    if (Number.isFinite(p.median)) {
      svgEl('circle', { r: 3, cy: y(p.median) - y(p.best), class: 'sv-median', 'data-ms': p.median }, { parent: g });
    }
    svgEl('circle', { r: 4.5, class: 'sv-best' }, { parent: g });
    svgEl('title', {}, { text: `${formatInt(p.positions)} cached positions: best ${formatMs(p.best)}, median ${formatMs(p.median)}`, parent: g });
  }
  return svg;
}

function legend(parent) {
  const list = html('ul', { cls: 'sv-legend sv-attn-legend', parent });
  for (const [cls, text, provenance] of [['is-best', 'best step of a length', 'measured'],
    ['is-median', 'median step', 'measured'], ['is-fit', 'straight line fitted through the measured best steps', 'computed'],
    ['is-floor', 'weights-only floor: weight bytes ÷ bandwidth', 'computed']]) {
    const li = html('li', { cls: `sv-key ${cls}`, text: `${text} `, parent: list });
    html('span', { cls: `tag tag-${provenance}`, text: provenance, parent: li });
  }
}

function figures(parent, r) {
  const items = [];
  if (r.fit) {
    items.push(['slope (fit)', `${formatInt(r.fit.slope_us_per_1k_positions)} µs per 1,000 positions`, 'computed', 'slope']);
    items.push(['step with no cache (fit)', formatMs(r.fit.intercept_ms), 'computed', 'intercept']);
  }
  if (r.floor) {
    items.push(['weights-only floor', formatMs(r.floor.floor_ms), 'computed', 'floor']);
    items.push(['KV reads at that bandwidth', `${formatInt(r.floor.kv_us_per_1k_positions)} µs per 1,000 positions`, 'computed', 'kv-slope']);
  }
  readouts(parent, items);
}

function lengths(parent, r) {
  const wrap = html('div', { cls: 'sv-table-wrap', parent });
  table(wrap, {
    cls: 'sv-table sv-attn-table',
    head: ['aimed at', 'cached positions', 'best step', 'median', 'KV read a step', 'from prefix cache'],
    rows: r.points.map((p) => [`${formatInt(p.target)}${p.at_limit ? ' (limit)' : ''}`,
      [formatInt(p.cached_positions), 'measured'], [formatMs(p.step_ms), 'measured'],
      [formatMs(p.step_ms_median), 'measured'], [formatSize(p.kv_bytes_read), 'computed'],
      [`${formatInt(p.cached_tokens)} of ${formatInt(p.prompt_tokens)}`, 'measured']]),
  });
}

function notes(parent, r) {
  const head = html('p', { cls: 'sv-note', parent });
  head.append('Each step reads the weights once and every cached key and value once: ');
  value(head, `${formatSize(r.kv_bytes_per_token)} a position`, 'computed');
  head.append(' for this model.');
  if (r.stopped) value(html('p', { cls: 'sv-note sv-attn-stopped', parent }), `Stopped: ${r.stopped}.`, 'measured');
  for (const basis of [r.fit?.basis, r.floor?.basis].filter(Boolean)) {
    html('p', { cls: 'sv-note sv-basis', text: `How: ${basis}.`, parent }).dataset.setting = '';
  }
}

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const r = response.result;
      html('p', { cls: 'sv-sub', text: 'Decode step time against the cached positions it reads (one request at a time)', parent: el });
      chart(el, chartModel(r));
      legend(el);
      figures(el, r);
      lengths(el, r);
      notes(el, r);
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
