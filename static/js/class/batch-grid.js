// The batch over time: engine steps as columns (the newest on the right), requests as rows, each
// cell what the request did in that step (prefill chunk, decode, recompute) or why it sat out
// (waiting, preempted); under it the last step's batch size and time, as the engine measured them.
// New steps push the columns left by redrawing, never by animation. When the engine goes idle the
// last steps stay drawn, and a hint says so (or, before any step, what will appear). A view opened late
// starts with the engine's last steps, which the feed keeps for it.
import { defineFigure } from '../shared/figure.js';
import { finder } from '../shared/dom.js';
import { formatFixed, formatInt } from '../shared/format.js';
import { followState } from './feed.js';
import { HISTORY_STEPS, gridRows } from './feed-state.js';
import { KIND_COLOURS } from './colors.js';
import { cssVar, fitCanvas } from './canvas.js';

const MIN_ROWS = 6;

// As many rows as fit with labels the back of the room can read (the newest requests win).
export function rowsThatFit(h, fontPx) {
  return Math.max(MIN_ROWS, Math.floor(h / (fontPx * 1.05)));
}

function policyText(p) {
  if (!p) return '';
  const parts = [`${p.batching} batching`, `max ${p.max_num_seqs} in the batch`];
  parts.push(p.chunked_prefill ? `chunked prefill (${p.chunk_size})` : 'whole-prompt prefill');
  parts.push(p.prefix_caching ? 'prefix caching on' : 'prefix caching off');
  return parts.join(' · ');
}

// What the hint under the grid says: nothing while the engine works, else why the grid is still.
export function gridHint(state) {
  const last = state?.lastStep;
  if (!last) return "No engine step yet: the columns fill as soon as a student's request runs.";
  if (state.running > 0 || state.waiting > 0) return '';
  return `The engine is idle since step ${last.step}: these are its last ${state.steps.length} steps; `
    + 'new steps push them to the left.';
}

// Faint column guides: the grid's shape shows before its first step and between busy spells.
function drawGuides(ctx, { w, h }, labelW, colW, line) {
  ctx.fillStyle = line;
  for (let x = 0; x <= HISTORY_STEPS; x += 8) ctx.fillRect(labelW + x * colW, 0, 1, h);
  ctx.fillRect(labelW, h - 1, w - labelW, 1);
}

function draw(ctx, { w, h }, state, colours, fontPx) {
  ctx.clearRect(0, 0, w, h);
  const fg = colours.fg;
  const labelW = fontPx * 6;
  const colW = (w - labelW) / HISTORY_STEPS;
  drawGuides(ctx, { w, h }, labelW, colW, colours.line);
  const rows = state ? gridRows(state).slice(-rowsThatFit(h, fontPx)) : [];
  const steps = state ? state.steps : [];
  if (!rows.length) return;
  const rowH = Math.min(fontPx * 1.8, h / Math.max(rows.length, 6));
  const offset = HISTORY_STEPS - steps.length; // fewer steps than columns: they sit on the right
  ctx.font = `${Math.min(fontPx * 0.85, rowH * 0.8)}px system-ui, sans-serif`;
  ctx.textBaseline = 'middle';
  rows.forEach((r, y) => {
    const top = y * rowH;
    ctx.fillStyle = fg;
    ctx.fillText(r.label, 4, top + rowH / 2, labelW - 8);
    steps.forEach((step, x) => {
      const kind = step.cells[r.key];
      if (!kind) return;
      const left = labelW + (offset + x) * colW;
      ctx.fillStyle = KIND_COLOURS[kind] || fg;
      ctx.fillRect(left + 1, top + 2, Math.max(1, colW - 2), rowH - 4);
      if (kind === 'preempted') { // a slash, so the state reads without colour too
        ctx.strokeStyle = '#000';
        ctx.beginPath();
        ctx.moveTo(left + 2, top + 3);
        ctx.lineTo(left + colW - 2, top + rowH - 3);
        ctx.stroke();
      }
    });
  });
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const canvas = q('canvas');
  const dom = { size: q('[data-batch-size]'), ms: q('[data-step-ms]'), tokens: q('[data-batch-tokens]'),
    step: q('[data-step]'), policy: q('[data-policy]'), more: q('[data-grid-more]'), hint: q('[data-grid-hint]') };
  let latest = null;
  let seen = -1;
  const colours = { fg: cssVar(el, '--fg', '#fff'), line: cssVar(el, '--line', '#3a3f4b') };
  // The page's type scales with the screen; the labels drawn on the canvas follow it.
  const fontPx = () => parseFloat(getComputedStyle(canvas).fontSize) || 16;
  const view = fitCanvas(figure, canvas, (ctx, size) => draw(ctx, size, latest, colours, fontPx()));

  followState(figure, (state) => {
    latest = state;
    if (state.version === seen) return;
    seen = state.version;
    view.redraw();
    const last = state.lastStep;
    dom.size.textContent = last ? formatInt(last.batchSize) : '–';
    dom.ms.textContent = last ? `${formatFixed(last.ms, 1)} ms` : '–';
    dom.tokens.textContent = last ? formatInt(last.batchTokens) : '–';
    dom.step.textContent = last ? formatInt(last.step) : '–';
    dom.policy.textContent = policyText(state.policy);
    const hint = gridHint(state);
    if (dom.hint.textContent !== hint) dom.hint.textContent = hint; // a status line: announce changes only
    dom.hint.hidden = !hint;
    const rows = gridRows(state);
    const fit = rowsThatFit(canvas.getBoundingClientRect().height, fontPx());
    dom.more.textContent = rows.length > fit ? `(${rows.length - fit} older rows not shown)` : '';
    canvas.setAttribute('aria-label', last
      ? `Batch grid: the last ${state.steps.length} engine steps for ${Math.min(rows.length, fit)} requests; `
        + `step ${last.step} ran ${last.batchSize} requests in ${formatFixed(last.ms, 1)} ms.`
      : 'Batch grid: no engine step yet.');
    el.dataset.step = last ? String(last.step) : '';
  });
});
