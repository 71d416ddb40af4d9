// The request lanes: one row per request in flight (and the last few that ended), labelled by the
// laptop that sent it ("laptop 7"), with its state, tokens and KV blocks. Prompt and answer text show
// only when the feed carries it (the teacher turned "show prompts" on), always as textContent.
import { defineFigure } from '../shared/figure.js';
import { html } from '../shared/dom.js';
import { formatInt, plural } from '../shared/format.js';
import { followState } from './feed.js';
import { endings, lanes } from './feed-state.js';
import { colourFor } from './colors.js';

// What the empty list says: a view opened after requests ended (counted, but never seen as lanes) must
// not claim there were none.
export const NO_REQUEST_YET = 'No request yet: send one from the page on your laptop.';
export const NONE_SINCE_OPENED = 'No request since this view opened (the counters include earlier ones).';

export function emptyText(state) {
  const ended = endings(state);
  return ended.finished + ended.cancelled + ended.error > 0 ? NONE_SINCE_OPENED : NO_REQUEST_YET;
}

export const MAX_LANES = 16; // rows on the projector; the rest are counted, not drawn
const MIN_LANES = 3;

// How many lanes the list's box holds: on the one-screen layout the list has the height the page
// leaves it (class.css clips it), so rows that would fall below are counted instead; elsewhere the
// page scrolls and MAX_LANES show.
export function lanesThatFit(boxPx, rowPx, gapPx) {
  if (!(boxPx > 0) || !(rowPx > 0)) return MAX_LANES;
  return Math.max(MIN_LANES, Math.min(MAX_LANES, Math.floor((boxPx + gapPx) / (rowPx + gapPx))));
}

function fitting(list) {
  const style = getComputedStyle(list);
  const first = list.firstElementChild;
  if (style.overflowY !== 'hidden' || !first) return MAX_LANES;
  return lanesThatFit(list.clientHeight, first.getBoundingClientRect().height, parseFloat(style.rowGap) || 0);
}
const STATUS_TEXT = {
  waiting: 'waiting', prefill: 'prefill', decode: 'decoding', recompute: 'recomputing', preempted: 'preempted',
  finished: 'finished', cancelled: 'cancelled', error: 'error',
};

// "decoding", "cancelled by the teacher", "error (timeout)": the reason only where it adds something.
function statusText(r, paused) {
  const base = STATUS_TEXT[r.status] || r.status;
  if (r.status === 'waiting' && paused) return 'waiting: paused by the teacher';
  if (r.status === 'cancelled' && r.cause === 'teacher') return 'cancelled by the teacher';
  if (!r.reason || r.status === 'finished' || r.reason === r.status) return base;
  return `${base} (${r.reason})`;
}

function makeRow(r) {
  const li = html('li', { cls: 'cv-lane' });
  li.dataset.request = r.key;
  const swatch = html('span', { cls: 'cv-lane-swatch', parent: li });
  swatch.style.background = colourFor(r.key);
  swatch.setAttribute('aria-hidden', 'true');
  const parts = {
    label: html('span', { cls: 'cv-lane-label', parent: li }),
    status: html('span', { cls: 'cv-lane-status', parent: li }),
    tokens: html('span', { cls: 'cv-lane-tokens', parent: li }),
    blocks: html('span', { cls: 'cv-lane-blocks', parent: li }),
    text: html('span', { cls: 'cv-lane-text', parent: li }),
  };
  return { li, parts };
}

function fill({ li, parts }, r, paused, showPrompts) {
  li.dataset.status = r.status;
  parts.label.textContent = r.label;
  parts.status.textContent = statusText(r, paused);
  const prompt = r.promptTokens == null ? '' : `${formatInt(r.promptTokens)} in · `;
  parts.tokens.textContent = `${prompt}${formatInt(r.tokens)} out`;
  parts.blocks.textContent = r.blocks.length ? plural(r.blocks.length, 'block') : '';
  // Text the feed brought while "show prompts" was on leaves the wall as soon as it is turned off.
  const text = showPrompts ? [r.prompt, r.answer].filter((t) => typeof t === 'string' && t).join(' → ') : '';
  parts.text.textContent = text;
  parts.text.hidden = !text;
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const list = el.querySelector('.cv-lanes-list');
  const more = el.querySelector('[data-lanes-more]');
  const empty = el.querySelector('[data-lanes-empty]');
  const rows = new Map(); // request key → {li, parts}
  let seen = -1;
  const drop = (key, row) => { row.li.remove(); rows.delete(key); };

  followState(figure, (state) => {
    if (state.version === seen) return;
    seen = state.version;
    const all = lanes(state);
    let shown = all.slice(0, MAX_LANES);
    const keep = new Set(shown.map((r) => r.key));
    for (const [key, row] of rows) if (!keep.has(key)) drop(key, row);
    shown.forEach((r, i) => {
      let row = rows.get(r.key);
      if (!row) { row = makeRow(r); rows.set(r.key, row); }
      fill(row, r, !!state.settings?.paused, !!state.settings?.show_prompts);
      if (list.children[i] !== row.li) list.insertBefore(row.li, list.children[i] || null);
    });
    // Measured once the rows are in: those past the list's box (one-screen layout) are counted instead.
    const fit = fitting(list);
    for (const r of shown.slice(fit)) drop(r.key, rows.get(r.key));
    shown = shown.slice(0, fit);
    const inFlight = all.filter((r) => !['finished', 'cancelled', 'error'].includes(r.status)).length;
    const hidden = all.length - shown.length;
    more.textContent = hidden > 0 ? `+${hidden} more not shown` : '';
    empty.hidden = all.length > 0;
    if (!all.length) empty.textContent = emptyText(state);
    el.dataset.inFlight = String(inFlight);
  });
});
