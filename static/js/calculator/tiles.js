// The cache-tiles figure: one row per sequence, one square per block of cached positions in the layers that keep
// every position (full attention, MLA), redrawn whenever the inputs change. Layers that stop growing (windows,
// chunks, states, shared layers) are not drawn as squares: the caption gives each such group's bounded bytes, so
// squares plus caption add up to the total. Squares are SVG rects with classes (no inline styles).
import { svgEl } from '../shared/dom.js';
import { binary, formatInt, plural } from '../shared/format.js';
import { MAX_COLS, tileLayout } from './layout.js';

const TILE = 20;
const GAP = 2;
const PITCH = TILE + GAP;
const GROWING = ['full', 'mla'];
const BOUNDED = { sliding: 'sliding-window', chunked: 'chunked-local', state: 'state', shared: 'KV-shared', cross: 'cross-attention (image positions)' };

// What the squares stand for: the growing groups' bytes per position over all GPUs, or (no group grows) the
// bounded group holding the most, drawn at the positions it keeps.
export function tileModel(parts, ctx, tp) {
  const growing = parts.filter((p) => GROWING.includes(p.kind));
  const bounded = parts.filter((p) => !GROWING.includes(p.kind));
  if (growing.length) {
    return {
      positions: ctx, bytesPerPosition: growing.reduce((a, p) => a + p.layers * p.layerTokenBytes, 0) * tp,
      layers: growing.reduce((a, p) => a + p.layers, 0), what: 'every position', bounded,
    };
  }
  const most = bounded.filter((p) => p.layerTokenBytes).sort((a, b) => b.sequenceBytes - a.sequenceBytes)[0];
  if (!most) return { positions: 0, bytesPerPosition: 0, layers: 0, what: 'no position', bounded };
  return {
    positions: most.positionsHeld, bytesPerPosition: most.layers * most.layerTokenBytes * tp, layers: most.layers,
    what: `the ${formatInt(most.positionsHeld)} positions its window keeps`, bounded: bounded.filter((p) => p !== most),
  };
}

function boundedText(p, tp) {
  const all = binary(p.sequenceBytes * tp).text;
  if (p.kind === 'state') return `${formatInt(p.layers)} state layers: a fixed ${all}`;
  if (p.kind === 'shared') return `${formatInt(p.layers)} KV-shared layers: nothing of their own`;
  return `${formatInt(p.layers)} ${BOUNDED[p.kind]} layers: ${formatInt(p.positionsAllocated)} positions, ${all}`;
}

export function renderTiles(svg, caption, { seq, block, parts, ctx, tp }) {
  const m = tileModel(parts, ctx, tp);
  const t = tileLayout(Math.max(1, m.positions), seq, block);
  const cols = m.positions ? t.cols : 0;
  svg.setAttribute('viewBox', `0 0 ${MAX_COLS * PITCH} ${Math.max(1, t.rows) * PITCH}`);
  svg.dataset.cols = String(cols);
  svg.dataset.rows = String(t.rows);
  svg.replaceChildren();
  for (let r = 0; r < t.rows; r += 1) {
    for (let c = 0; c < cols; c += 1) {
      const x = c * PITCH;
      const y = r * PITCH;
      const fill = c === cols - 1 ? t.lastFill : 1;
      svg.append(svgEl('rect', { class: 'kvc-tile', x, y, width: TILE, height: TILE, rx: 3 }));
      svg.append(svgEl('rect', { class: 'kvc-tile-fill', x, y, width: TILE * fill, height: TILE, rx: fill === 1 ? 3 : 0 }));
    }
  }
  const tileBytes = binary(t.perTile * m.bytesPerPosition).text;
  const what = t.blocksPerTile === 1
    ? `one block of ${plural(block, 'position')}`
    : `${formatInt(t.perTile)} positions (${formatInt(t.blocksPerTile)} blocks of ${formatInt(block)})`;
  const gpus = tp > 1 ? ` over all ${tp} GPUs` : '';
  svg.setAttribute('aria-label', `Cache tiles: ${plural(seq, 'sequence')} of ${plural(cols, 'square')} each.`);
  const drawn = m.layers
    ? `Each square is ${what} of one sequence in the ${plural(m.layers, 'layer')} that keep ${m.what}: ${tileBytes}${gpus} when full. `
      + `${plural(cols, 'square')} per sequence${t.lastFill < 1 && cols ? ', the last one partly filled' : ''}. ` : 'No layer keeps positions. ';
  const rest = m.bounded.length ? `Not drawn, per sequence: ${m.bounded.map((p) => boundedText(p, tp)).join('; ')}. ` : '';
  caption.textContent = drawn + rest
    + (t.hiddenRows ? `The first ${t.rows} sequences are drawn; the other ${formatInt(t.hiddenRows)} are the same.` : '');
}
