// Small plain-SVG charts (line/scatter, histogram, horizontal lanes) with axes, labels and a legend.
// Each call replaces the container's content and returns the <svg>. Every plotted point carries
// data-x / data-y so a reader's tools (and tests) can read back exactly what was drawn.
import { svgEl } from '../shared/dom.js';
import { extent, linearScale, niceDomain, ticks, formatTick, histogramBins } from './scale.js';

const MAX_W = 640;
const MIN_W = 260;
const H = 250;
const M = { top: 30, right: 14, bottom: 44, left: 60 };
let idCounter = 0;

// The drawing width follows the container, so text keeps its size on a phone instead of being
// scaled down with the whole picture; a container not laid out yet gets the widest drawing.
function widthOf(container) {
  const w = container.clientWidth;
  return w > 0 ? Math.max(MIN_W, Math.min(MAX_W, Math.round(w))) : MAX_W;
}

// Charts redraw when their container's width changes (a phone turned, a window resized), so the
// drawing keeps fitting. Redraws wait for the next frame: drawing inside the observer callback
// would resize the container again within the same frame.
const drawn = new WeakMap(); // container → {W, draw}
const resizer = typeof ResizeObserver === 'undefined' ? null : new ResizeObserver((entries) => {
  for (const { target } of entries) {
    const rec = drawn.get(target);
    if (rec && widthOf(target) !== rec.W) requestAnimationFrame(() => { if (drawn.get(target) === rec) rec.draw(); });
  }
});

function remember(container, W, draw) {
  drawn.set(container, { W, draw });
  resizer?.observe(container);
}

// The <svg> with its accessible name and description; the container gets it as its only child.
function frame(container, { title, desc, height = H, className = '' }) {
  idCounter += 1;
  const id = `chart-${idCounter}`;
  const W = widthOf(container);
  const svg = svgEl('svg', {
    viewBox: `0 0 ${W} ${height}`, class: `chart ${className}`.trim(), role: 'img',
    'aria-labelledby': `${id}-t ${id}-d`, preserveAspectRatio: 'xMidYMid meet',
  });
  svg.append(svgEl('title', { id: `${id}-t` }, { text: title || 'chart' }), svgEl('desc', { id: `${id}-d` }, { text: desc || '' }));
  container.replaceChildren(svg);
  return { svg, W };
}

function axes(svg, x, y, { xLabel, yLabel, height = H, xTickFormat = formatTick }) {
  const g = svgEl('g', { class: 'chart-axes' });
  const [x0, x1] = x.range;
  const [y0, y1] = y.range;
  for (const t of ticks(y.domain, 5)) {
    const py = y(t);
    g.append(svgEl('line', { class: 'chart-grid', x1: x0, x2: x1, y1: py, y2: py }));
    g.append(svgEl('text', { class: 'chart-tick', x: x0 - 6, y: py + 4, 'text-anchor': 'end' }, { text: formatTick(t) }));
  }
  for (const t of ticks(x.domain, 6)) {
    const px = x(t);
    g.append(svgEl('line', { class: 'chart-tickmark', x1: px, x2: px, y1: y0, y2: y0 + 4 }));
    g.append(svgEl('text', { class: 'chart-tick', x: px, y: y0 + 16, 'text-anchor': 'middle' }, { text: xTickFormat(t) }));
  }
  g.append(svgEl('line', { class: 'chart-axis', x1: x0, x2: x1, y1: y0, y2: y0 }));
  g.append(svgEl('line', { class: 'chart-axis', x1: x0, x2: x0, y1: y0, y2: y1 }));
  if (xLabel) g.append(svgEl('text', { class: 'chart-label', x: (x0 + x1) / 2, y: height - 6, 'text-anchor': 'middle' }, { text: xLabel }));
  if (yLabel) {
    g.append(svgEl('text', {
      class: 'chart-label', x: 0, y: 0, 'text-anchor': 'middle',
      transform: `translate(14 ${(y0 + y1) / 2}) rotate(-90)`,
    }, { text: yLabel }));
  }
  svg.append(g);
}

function legend(svg, names) {
  const g = svgEl('g', { class: 'chart-legend' });
  let px = M.left;
  names.forEach((name, i) => {
    g.append(svgEl('rect', { class: `chart-swatch chart-s${i % 6}`, x: px, y: 8, width: 12, height: 12, rx: 2 }));
    g.append(svgEl('text', { class: 'chart-legend-text', x: px + 16, y: 18 }, { text: name }));
    px += 28 + name.length * 7;
  });
  svg.append(g);
}

function emptyNote(svg, W, text, height = H) {
  svg.append(svgEl('text', { class: 'chart-empty', x: W / 2, y: height / 2, 'text-anchor': 'middle' }, { text }));
}

// series: [{name, points: [{x, y}], style: 'line' | 'points' | 'both', hollow}]; hollow points let
// a line drawn under them (say, a formula over a measurement) stay visible.
export function lineChart(container, options) {
  const { title, desc, xLabel, yLabel, series, emptyText = 'no data yet' } = options;
  const { svg, W } = frame(container, { title, desc });
  remember(container, W, () => lineChart(container, options));
  const all = series.flatMap((s) => s.points);
  const xs = niceDomain(extent(all.map((p) => p.x), [0, 1]), 6);
  const [ylo, yhi] = extent(all.map((p) => p.y), [0, 1]);
  const ys = niceDomain([Math.min(0, ylo), yhi], 5);
  const x = linearScale(xs, [M.left, W - M.right]);
  const y = linearScale(ys, [H - M.bottom, M.top]);
  axes(svg, x, y, { xLabel, yLabel });
  if (series.length > 1 || series[0]?.name) legend(svg, series.map((s) => s.name || ''));
  if (!all.length) emptyNote(svg, W, emptyText);
  series.forEach((s, i) => {
    const g = svgEl('g', { class: `chart-series chart-s${i % 6}`, 'data-series': s.name || '' });
    const style = s.style || 'both';
    if (style !== 'points' && s.points.length > 1) {
      const d = s.points.map((p, j) => `${j ? 'L' : 'M'}${x(p.x).toFixed(1)} ${y(p.y).toFixed(1)}`).join(' ');
      g.append(svgEl('path', { class: 'chart-line', d }));
    }
    for (const p of s.points) {
      g.append(svgEl('circle', {
        class: s.hollow ? 'chart-point chart-point-hollow' : 'chart-point', cx: x(p.x).toFixed(1), cy: y(p.y).toFixed(1), r: style === 'line' ? 1.6 : 3,
        'data-x': p.x, 'data-y': p.y,
      }));
    }
    svg.append(g);
  });
  return svg;
}

export function histogram(container, options) {
  const { title, desc, xLabel, yLabel = 'count', values, binCount = 12, emptyText = 'no data yet' } = options;
  const { svg, W } = frame(container, { title, desc });
  remember(container, W, () => histogram(container, options));
  const bins = histogramBins(values, binCount);
  const xs = bins.length ? [bins[0].x0, bins[bins.length - 1].x1] : [0, 1];
  // Counts are whole numbers: at least 0–4 on the axis, so no tick falls between two counts.
  const ys = niceDomain([0, Math.max(4, ...bins.map((b) => b.count))], 4);
  const x = linearScale(xs, [M.left, W - M.right]);
  const y = linearScale(ys, [H - M.bottom, M.top]);
  axes(svg, x, y, { xLabel, yLabel });
  if (!bins.length) emptyNote(svg, W, emptyText);
  const g = svgEl('g', { class: 'chart-series chart-s0', 'data-series': 'bins' });
  for (const b of bins) {
    g.append(svgEl('rect', {
      class: 'chart-bar', x: x(b.x0) + 1, y: y(b.count), width: Math.max(1, x(b.x1) - x(b.x0) - 2),
      height: y(0) - y(b.count), 'data-x0': b.x0, 'data-x1': b.x1, 'data-count': b.count,
    }));
  }
  svg.append(g);
  return svg;
}

// lanes: [{name, segments: [{from, to, kind}], marks: [{at, label}]}] on one shared time axis.
// `kind` names a CSS class (chart-seg-KIND), e.g. queue / prefill / decode / waiting / receiving.
export function laneChart(container, options) {
  const { title, desc, xLabel, lanes, kinds = [] } = options;
  const laneH = 34;
  const height = M.top + lanes.length * laneH + M.bottom;
  const { svg, W } = frame(container, { title, desc, height, className: 'chart-lanes' });
  remember(container, W, () => laneChart(container, options));
  const all = lanes.flatMap((l) => [...l.segments.flatMap((s) => [s.from, s.to]), ...(l.marks || []).map((m) => m.at)]);
  const xs = niceDomain([0, extent(all, [0, 1])[1]], 6);
  const left = M.left + 40;
  const x = linearScale(xs, [left, W - M.right]);
  const y = linearScale([0, lanes.length], [M.top, M.top + lanes.length * laneH]);
  const g = svgEl('g', { class: 'chart-axes' });
  for (const t of ticks(xs, 6)) {
    g.append(svgEl('line', { class: 'chart-grid', x1: x(t), x2: x(t), y1: M.top, y2: height - M.bottom }));
    g.append(svgEl('text', { class: 'chart-tick', x: x(t), y: height - M.bottom + 16, 'text-anchor': 'middle' }, { text: formatTick(t) }));
  }
  if (xLabel) g.append(svgEl('text', { class: 'chart-label', x: W / 2, y: height - 6, 'text-anchor': 'middle' }, { text: xLabel }));
  svg.append(g);
  if (kinds.length) legendKinds(svg, kinds);
  lanes.forEach((lane, i) => {
    const lg = svgEl('g', { class: 'chart-lane', 'data-lane': lane.name });
    const top = y(i) + 6;
    lg.append(svgEl('text', { class: 'chart-tick chart-lane-name', x: left - 8, y: top + 15, 'text-anchor': 'end' }, { text: lane.name }));
    for (const s of lane.segments) {
      lg.append(svgEl('rect', {
        class: `chart-seg chart-seg-${s.kind}`, x: x(s.from), y: top, width: Math.max(1, x(s.to) - x(s.from)), height: laneH - 12,
        'data-kind': s.kind, 'data-from': s.from, 'data-to': s.to,
      }));
    }
    for (const m of lane.marks || []) {
      lg.append(svgEl('line', { class: 'chart-mark', x1: x(m.at), x2: x(m.at), y1: top - 3, y2: top + laneH - 9, 'data-at': m.at, 'data-label': m.label }));
    }
    svg.append(lg);
  });
  return svg;
}

function legendKinds(svg, kinds) {
  const g = svgEl('g', { class: 'chart-legend' });
  let px = M.left;
  for (const { kind, label } of kinds) {
    g.append(svgEl('rect', { class: `chart-seg chart-seg-${kind}`, x: px, y: 8, width: 12, height: 12, rx: 2 }));
    g.append(svgEl('text', { class: 'chart-legend-text', x: px + 16, y: 18 }, { text: label }));
    px += 28 + label.length * 7;
  }
  svg.append(g);
}
