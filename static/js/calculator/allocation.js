// Allocation vs useful content: each request of the mix as a bar on the scale of the context length
// (contiguous reservation = the whole bar, paged = whole blocks, used = the filled part), and a table
// of reserved vs used bytes for both strategies.
import { allocation } from './kv-math.js';
import { html, labelCells, svgEl } from '../shared/dom.js';
import { MISSING, formatInt, plural } from '../shared/format.js';
import { bytesNode } from './bytes.js';

const WIDTH = 704;
const BAR = 20;
const PITCH = 28;
const MIN_BLOCK_PX = 4; // block boundaries closer than this would only smear the bar

export function renderAllocation(svg, table, { mix, block, ctx, bytesPerToken }) {
  const a = allocation(mix, block, ctx, bytesPerToken);
  drawBars(svg, a, block, ctx);
  const rows = [
    ['Used (useful content)', a.usedTokens, a.usedBytes, null],
    [`Paged, blocks of ${plural(block, 'token')}`, a.pagedTokens, a.pagedBytes, a.pagedBytes - a.usedBytes],
    [`Contiguous, ${formatInt(ctx)} per request`, a.contiguousTokens, a.contiguousBytes, a.contiguousBytes - a.usedBytes],
  ];
  const body = table.tBodies[0];
  body.replaceChildren(...rows.map(([name, tokens, bytes, waste]) => {
    const tr = html('tr');
    const th = html('th', { text: name });
    th.scope = 'row';
    tr.append(th, html('td', { text: formatInt(tokens) }));
    const bytesCell = html('td');
    bytesCell.append(bytesNode(bytes));
    const wasteCell = html('td');
    if (waste === null) wasteCell.textContent = MISSING;
    else wasteCell.append(bytesNode(waste), ` (${percent(waste, bytes)} of the reservation)`);
    tr.append(bytesCell, wasteCell);
    return labelCells(table, tr);
  }));
  return a;
}

function percent(part, whole) {
  return `${whole ? ((100 * part) / whole).toFixed(1) : '0.0'}%`;
}

function drawBars(svg, a, block, ctx) {
  const scale = WIDTH / ctx;
  svg.setAttribute('viewBox', `0 0 ${WIDTH} ${a.lengths.length * PITCH}`);
  svg.replaceChildren();
  a.lengths.forEach((used, i) => {
    const y = i * PITCH;
    const paged = Math.ceil(used / block) * block;
    svg.append(svgEl('rect', { class: 'kvc-contig', x: 0.5, y: y + 0.5, width: WIDTH - 1, height: BAR }));
    svg.append(svgEl('rect', { class: 'kvc-paged', x: 0, y, width: paged * scale, height: BAR + 1 }));
    svg.append(svgEl('rect', { class: 'kvc-used', x: 0, y, width: used * scale, height: BAR + 1 }));
    if (block * scale >= MIN_BLOCK_PX) {
      for (let t = block; t < paged; t += block) {
        svg.append(svgEl('line', { class: 'kvc-blockline', x1: t * scale, x2: t * scale, y1: y, y2: y + BAR + 1 }));
      }
    }
  });
  svg.setAttribute('aria-label', `${plural(a.lengths.length, 'request')} of ${a.lengths.map(formatInt).join(', ')} tokens `
    + `against a reservation of ${formatInt(ctx)} each; paged blocks of ${formatInt(block)}.`);
}
