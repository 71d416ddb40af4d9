// DOM pieces the chapter's figures share: a labelled value, a horizontal bar, a key/value list, a
// small table and a chart's axes. Every number goes in through textContent inside an element that names its provenance.
import { html, svgEl } from '../shared/dom.js';

// A value with its provenance: <span data-provenance="measured">12.5 ms</span>.
export function value(parent, text, provenance = 'measured', cls = 'sv-num') {
  const node = html('span', { cls, text, parent });
  node.dataset.provenance = provenance;
  return node;
}

// A setting of the experiment (a chunk size, a proposer): an input the run was given, not a finding,
// so it carries no provenance tag (the provenance walk treats [data-setting] as structure).
export function setting(parent, text, cls = 'sv-setting') {
  const node = html('span', { cls, text, parent });
  node.dataset.setting = '';
  return node;
}

// A provenance tag as the rest of the page draws it.
export function tag(parent, provenance) {
  return html('span', { cls: `tag tag-${provenance}`, text: provenance, parent });
}

// One labelled horizontal bar: label, bar (width = fraction of the track), value text.
export function barRow(parent, { label, fraction, text, cls = '', provenance = 'measured', data = {} }) {
  const row = html('div', { cls: `sv-bar-row ${cls}`.trim(), parent });
  // The label names a setting of the experiment (a batch size, a request), not a finding.
  html('span', { cls: 'sv-bar-label', text: label, parent: row }).dataset.setting = '';
  const track = html('span', { cls: 'sv-bar-track', parent: row });
  const bar = html('span', { cls: 'sv-bar', parent: track });
  bar.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  bar.dataset.fraction = String(fraction);
  for (const [k, v] of Object.entries(data)) bar.dataset[k] = String(v);
  value(row, text, provenance, 'sv-bar-value');
  return row;
}

// A definition list of readouts: [[term, text, provenance], …].
export function readouts(parent, items, cls = 'sv-readouts') {
  const dl = html('dl', { cls, parent });
  for (const [term, text, provenance = 'measured', key] of items) {
    const wrap = html('div', { parent: dl });
    html('dt', { text: term, parent: wrap });
    const dd = html('dd', { parent: wrap });
    const v = value(dd, text, provenance);
    if (key) v.dataset.key = key;
  }
  return dl;
}

// A small table: header cells, then rows of [text, provenance] pairs (or plain text for labels).
export function table(parent, { caption, head, rows, cls = 'sv-table' }) {
  const t = html('table', { cls, parent });
  if (caption) html('caption', { text: caption, parent: t });
  const hr = html('tr', { parent: html('thead', { parent: t }) });
  for (const h of head) html('th', { text: h, parent: hr }).setAttribute('scope', 'col');
  const body = html('tbody', { parent: t });
  for (const row of rows) {
    const tr = html('tr', { parent: body });
    row.forEach((cell, i) => {
      const td = html(i === 0 ? 'th' : 'td', { parent: tr });
      if (i === 0) { td.setAttribute('scope', 'row'); td.dataset.setting = ''; } // a row's name, not a finding
      if (Array.isArray(cell)) value(td, cell[0], cell[1]);
      else td.textContent = cell;
      if (head[i]) td.dataset.label = head[i];
    });
  }
  return t;
}

export function clear(el) {
  el.replaceChildren();
}

// A chart's grid and axes in an SVG of `box` {W, H, M} (M: the margins): a line and a computed label at
// each tick (`x`, `y` map values to pixels; `xText`, `yText` write a tick), and the two axis titles.
export function axes(svg, { W, H, M }, { x, y, xTicks, yTicks, xText, yText, xTitle, yTitle }) {
  const bottom = H - M.bottom;
  const middle = (M.top + bottom) / 2;
  for (const t of xTicks) {
    svgEl('line', { x1: x(t), x2: x(t), y1: M.top, y2: bottom, class: 'sv-grid' }, { parent: svg });
    svgEl('text', { x: x(t), y: bottom + 14, class: 'sv-axis', 'text-anchor': 'middle', 'data-provenance': 'computed' },
      { text: xText(t), parent: svg });
  }
  for (const t of yTicks) {
    svgEl('line', { x1: M.left, x2: W - M.right, y1: y(t), y2: y(t), class: 'sv-grid' }, { parent: svg });
    svgEl('text', { x: M.left - 4, y: y(t) + 3, class: 'sv-axis', 'text-anchor': 'end', 'data-provenance': 'computed' },
      { text: yText(t), parent: svg });
  }
  svgEl('text', { x: (M.left + W - M.right) / 2, y: H - 6, class: 'sv-axis-title', 'text-anchor': 'middle' },
    { text: xTitle, parent: svg });
  svgEl('text', { x: 12, y: middle, class: 'sv-axis-title', 'text-anchor': 'middle', transform: `rotate(-90 12 ${middle})` },
    { text: yTitle, parent: svg });
}
