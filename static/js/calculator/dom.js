// Small DOM helpers shared by the calculator's figures: SVG elements, text nodes, byte read-outs.
import { UNIT_NAMES, binary, formatBytes } from './format.js';

const SVG_NS = 'http://www.w3.org/2000/svg';

export function svgEl(name, attrs = {}) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

export function html(name, { cls, text } = {}) {
  const node = document.createElement(name);
  if (cls) node.className = cls;
  if (text != null) node.textContent = text;
  return node;
}

// "1,073,741,824 B = 1 GiB" / "5,033,164,800 B ≈ 4.69 GiB", the unit an <abbr> that names it.
export function bytesNode(n) {
  const b = binary(n);
  const wrap = html('span', { cls: 'kvc-bytes' });
  wrap.append(html('span', { cls: 'kvc-exact', text: formatBytes(n) }));
  if (b.unit === 'B') return wrap;
  const approx = html('span', { cls: 'kvc-bin', text: `${b.exact ? '=' : '≈'} ${b.number} ` });
  const abbr = html('abbr', { text: b.unit });
  abbr.title = UNIT_NAMES[b.unit];
  approx.append(abbr);
  wrap.append(' ', approx);
  return wrap;
}

// Each cell of a new row carries its column's name (from the header's data-label), so narrow
// screens can stack the table into labelled lines.
export function labelCells(table, tr) {
  const labels = [...table.tHead.rows[0].cells].map((c) => c.dataset.label || '');
  [...tr.cells].forEach((cell, i) => { if (labels[i]) cell.dataset.label = labels[i]; });
  return tr;
}
