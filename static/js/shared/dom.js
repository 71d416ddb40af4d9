// DOM helpers every figure uses. Text always goes in through textContent (never innerHTML), so
// model output and server messages can never become markup.

const SVG_NS = 'http://www.w3.org/2000/svg';

// Sets every attribute whose value is not null/undefined (an absent value means "leave it off").
export function setAttrs(node, attrs = {}) {
  for (const [k, v] of Object.entries(attrs)) if (v != null) node.setAttribute(k, String(v));
  return node;
}

// An SVG element: svgEl('rect', {x: 0, class: 'bar'}, {text, parent}); appended to `parent` if given.
export function svgEl(name, attrs = {}, { text, parent } = {}) {
  const node = setAttrs(document.createElementNS(SVG_NS, name), attrs);
  if (text != null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

// An HTML element: html('span', {cls: 'tag', text: 'measured', parent}); appended to `parent` if given.
export function html(name, { cls, text, parent } = {}) {
  const node = document.createElement(name);
  if (cls) node.className = cls;
  if (text != null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

// `const $ = finder(root)`: querySelector scoped to one figure, so figures never reach into each other.
export function finder(root) {
  return (selector) => root.querySelector(selector);
}

// Each cell of a new table row carries its column's name (from the header's data-label), so narrow
// screens can stack the table into labelled lines.
export function labelCells(table, tr) {
  const labels = [...table.tHead.rows[0].cells].map((c) => c.dataset.label || '');
  [...tr.cells].forEach((cell, i) => { if (labels[i]) cell.dataset.label = labels[i]; });
  return tr;
}

// Scripted scrolling and motion honour the reader's setting, as the CSS transitions do.
export function prefersReducedMotion() {
  return window.matchMedia('(prefers-reduced-motion: reduce)').matches;
}
