// The cache-tiles figure: one row per sequence, one square per block of cached tokens, redrawn
// whenever the inputs change. Squares are SVG rects with classes (no inline styles).
import { svgEl } from '../shared/dom.js';
import { binary, formatInt, plural } from '../shared/format.js';
import { MAX_COLS, tileLayout } from './layout.js';

const TILE = 20;
const GAP = 2;
const PITCH = TILE + GAP;

export function renderTiles(svg, caption, { ctx, seq, block, bytesPerToken }) {
  const t = tileLayout(ctx, seq, block);
  const width = MAX_COLS * PITCH;
  const height = t.rows * PITCH;
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.dataset.cols = String(t.cols);
  svg.dataset.rows = String(t.rows);
  svg.replaceChildren();
  for (let r = 0; r < t.rows; r += 1) {
    for (let c = 0; c < t.cols; c += 1) {
      const x = c * PITCH;
      const y = r * PITCH;
      const fill = c === t.cols - 1 ? t.lastFill : 1;
      svg.append(svgEl('rect', { class: 'kvc-tile', x, y, width: TILE, height: TILE, rx: 3 }));
      svg.append(svgEl('rect', { class: 'kvc-tile-fill', x, y, width: TILE * fill, height: TILE, rx: fill === 1 ? 3 : 0 }));
    }
  }
  const tileBytes = binary(t.perTile * bytesPerToken).text;
  const what = t.blocksPerTile === 1
    ? `one block of ${plural(block, 'token')}`
    : `${formatInt(t.perTile)} tokens (${formatInt(t.blocksPerTile)} blocks of ${formatInt(block)})`;
  svg.setAttribute('aria-label', `Cache tiles: ${plural(seq, 'sequence')} of ${plural(t.cols, 'square')} each.`);
  caption.textContent = `Each square is ${what} of one sequence: ${tileBytes} when full. `
    + `${plural(t.cols, 'square')} per sequence${t.lastFill < 1 ? ', the last one partly filled' : ''}. `
    + (t.hiddenRows ? `The first ${t.rows} sequences are drawn; the other ${formatInt(t.hiddenRows)} are the same.` : '');
}
