// The KV block map: every block of the paged pool as one cell, filled with the colour of the request
// that holds it (the lanes use the same colours), a shared prefix block ringed in white, a free one
// left empty; under it the bytes filled with tokens vs reserved by requests vs kept for prefixes vs the
// whole pool, computed from the engine's block and token counts × bytes per block. A cell's place is
// its block id modulo the pool size.
import { defineFigure } from '../shared/figure.js';
import { finder } from '../shared/dom.js';
import { formatInt, formatSize } from '../shared/format.js';
import { followState } from './feed.js';
import { kvBytes } from './feed-state.js';
import { colourFor } from './colors.js';
import { cssVar, fitCanvas } from './canvas.js';

// The squarest grid of `total` cells that fits w × h: columns and the cell's side.
export function gridShape(total, w, h) {
  let best = { cols: 1, side: 0 };
  for (let cols = 1; cols <= total; cols += 1) {
    const rows = Math.ceil(total / cols);
    const side = Math.min(w / cols, h / rows);
    if (side > best.side) best = { cols, side };
  }
  return best;
}

function draw(ctx, { w, h }, state, colours) {
  ctx.clearRect(0, 0, w, h);
  const total = state?.kv?.total;
  if (!total) return;
  const { cols, side } = gridShape(total, w, h);
  const gap = side > 6 ? 1 : 0;
  ctx.lineWidth = 1;
  for (let i = 0; i < total; i += 1) {
    const x = (i % cols) * side;
    const y = Math.floor(i / cols) * side;
    ctx.strokeStyle = colours.free;
    ctx.strokeRect(x + gap + 0.5, y + gap + 0.5, side - 2 * gap - 1, side - 2 * gap - 1);
  }
  for (const [id, block] of state.blocks) {
    const i = ((id % total) + total) % total;
    const x = (i % cols) * side;
    const y = Math.floor(i / cols) * side;
    ctx.fillStyle = colourFor(block.owner);
    ctx.fillRect(x + gap, y + gap, side - 2 * gap, side - 2 * gap);
    if (block.shared) {
      ctx.strokeStyle = colours.shared;
      ctx.lineWidth = Math.max(2, side / 6);
      ctx.strokeRect(x + gap + 1, y + gap + 1, side - 2 * gap - 2, side - 2 * gap - 2);
      ctx.lineWidth = 1;
    }
  }
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const canvas = q('canvas');
  const dom = { filled: q('[data-kv-filled]'), used: q('[data-kv-used]'), cached: q('[data-kv-cached]'), pool: q('[data-kv-pool]'),
    blocks: q('[data-kv-blocks]'), shared: q('[data-kv-shared]') };
  const colours = { free: cssVar(el, '--free-block', '#555'), shared: cssVar(el, '--fg', '#fff') };
  let latest = null;
  let seen = -1;
  const view = fitCanvas(figure, canvas, (ctx, size) => draw(ctx, size, latest, colours));

  followState(figure, (state) => {
    latest = state;
    if (state.version === seen) return;
    seen = state.version;
    view.redraw();
    const bytes = kvBytes(state);
    const kv = state.kv;
    const shared = [...state.blocks.values()].filter((b) => b.shared).length;
    dom.filled.textContent = bytes ? formatSize(bytes.filled) : '–';
    dom.used.textContent = bytes ? `${formatSize(bytes.used)} (${formatInt(kv.used)} blocks)` : '–';
    dom.cached.textContent = bytes ? `${formatSize(bytes.cached)} (${formatInt(kv.cached || 0)} blocks)` : '–';
    dom.pool.textContent = bytes ? `${formatSize(bytes.pool)} (${formatInt(kv.total)} blocks)` : '–';
    dom.blocks.textContent = kv ? `${formatInt(kv.block_size)} positions a block, ${formatSize(kv.bytes_per_block)} each` : '–';
    dom.shared.textContent = formatInt(shared);
    canvas.setAttribute('aria-label', kv
      ? `KV block map: ${kv.used} of ${kv.total} blocks held by requests, ${kv.cached || 0} kept for shared prefixes, `
        + `${kv.free} free; ${shared} shared prefix blocks.`
      : 'KV block map: the pool is not known yet.');
    el.dataset.used = kv ? String(kv.used) : '';
  });
});
