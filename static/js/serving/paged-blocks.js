// Stage 3 figure: the KV block pool as requests come and go (one cell per block, coloured by owner,
// shared blocks marked; a slider picks the moment), then reserved vs used bytes (measured) beside one
// max-length contiguous reservation per request (computed), linked to the calculator's comparison.
import { html } from '../shared/dom.js';
import { formatInt, formatSize } from '../shared/format.js';
import { barRow, clear, setting, value } from './view.js';
import { blockCells, peakFrame, share } from './math.js';

const OWNER_COLOURS = 6; // owners cycle through this many colours (serving.css .owner-0 … .owner-5)

function ownerIndex(owners) {
  const seen = new Map();
  for (const o of owners) if (o != null && !seen.has(o)) seen.set(o, seen.size % OWNER_COLOURS);
  return seen;
}

function drawFrame(map, caption, result, index, colours) {
  const frame = result.frames[index];
  map.replaceChildren();
  for (const [i, cell] of blockCells(frame, result.block_ids).entries()) {
    const b = html('span', { cls: 'sv-block', parent: map });
    b.dataset.block = String(i);
    if (cell.owner == null) b.classList.add('is-free');
    else {
      b.classList.add(`owner-${colours.get(cell.owner)}`);
      b.dataset.owner = cell.owner;
      b.textContent = cell.owner;
    }
    if (cell.shared) b.classList.add('is-shared');
  }
  const taken = frame.owners.filter((o) => o != null).length;
  caption.replaceChildren();
  caption.append('Step ');
  value(caption, formatInt(frame.step), 'measured');
  caption.append(': ');
  value(caption, `${formatInt(taken)} blocks`, 'measured');
  caption.append(' held, of the ');
  value(caption, formatInt(frame.owners.length), 'measured');
  caption.append(' this run touched in a pool of ');
  value(caption, formatInt(result.pool_blocks), 'measured');
  caption.append('; ');
  value(caption, formatInt((frame.shared || []).length), 'measured');
  caption.append(' shared.');
}

function bytesBars(parent, r) {
  const window = Number.isFinite(r.window_bytes) ? r.window_bytes : null;
  const all = [r.reserved_bytes, r.used_bytes, r.contiguous_bytes, ...(window ? [window] : [])];
  const box = html('div', { cls: 'sv-bars', parent });
  // positions × bytes per position and blocks × bytes per block: worked out from the pool's counts
  barRow(box, { label: 'used', fraction: share(r.used_bytes, all), text: formatSize(r.used_bytes),
    cls: 'sv-used', provenance: 'computed', data: { value: r.used_bytes } });
  barRow(box, { label: 'reserved', fraction: share(r.reserved_bytes, all), text: formatSize(r.reserved_bytes),
    cls: 'sv-reserved', provenance: 'computed', data: { value: r.reserved_bytes } });
  barRow(box, { label: 'contiguous', fraction: share(r.contiguous_bytes, all),
    text: formatSize(r.contiguous_bytes), cls: 'sv-contig', provenance: 'computed', data: { value: r.contiguous_bytes } });
  if (window) {
    barRow(box, { label: 'whole window', fraction: share(window, all), text: formatSize(window), cls: 'sv-window',
      provenance: 'computed', data: { value: window } });
  }
  const note = html('p', { cls: 'sv-note', parent: box });
  note.append('Blocks of ');
  setting(note, `${formatInt(r.block_size)} positions`); // the pool's configuration, not a finding
  note.append(', ');
  value(note, formatSize(r.bytes_per_block), 'computed');
  note.append(' each; pool ');
  value(note, formatSize(r.pool_bytes), 'computed');
  note.append('. Used: the positions requests hold, times the bytes a position takes; reserved: the blocks they hold, '
    + 'times a block\'s bytes. The contiguous bar is ');
  html('span', { cls: 'tag tag-computed', text: 'computed', parent: note });
  note.append(window
    ? ': one reservation per request of its prompt plus its maximum answer, as a server without paging must make '
      + 'before it knows how long the answer will be'
    : ': one reservation of the maximum length per request, as a server without paging must make');
  if (r.contiguous_basis) {
    note.append(' (');
    value(note, r.contiguous_basis, 'computed');
    note.append(')');
  }
  if (window) {
    note.append('; a server that reserved the whole context window for each would take the last bar (');
    value(note, r.window_basis, 'computed');
    note.append(')');
  }
  note.append('. ');
  const a = html('a', { text: 'The calculator compares the two for any model', parent: note });
  a.href = '#calculator';
  note.append('.');
}

export function mount(el) {
  let slider = null;
  let onInput = null;
  const drop = () => { if (slider && onInput) slider.removeEventListener('input', onInput); slider = null; };
  return {
    show(response) {
      drop();
      clear(el);
      const r = response.result;
      const colours = ownerIndex(r.frames.flatMap((f) => f.owners));
      const label = html('label', { cls: 'sv-slider', parent: el });
      html('span', { text: 'Moment in the run ', parent: label });
      slider = html('input', { parent: label });
      Object.assign(slider, { type: 'range', min: 0, max: Math.max(0, r.frames.length - 1), step: 1 });
      slider.value = String(peakFrame(r.frames));
      const map = html('div', { cls: 'sv-blockmap', parent: el });
      map.setAttribute('role', 'img');
      const caption = html('p', { cls: 'sv-note sv-frame-caption', parent: el });
      caption.setAttribute('aria-live', 'polite');
      const draw = () => {
        const i = Number(slider.value);
        drawFrame(map, caption, r, i, colours);
        slider.setAttribute('aria-valuetext', `frame ${i + 1} of ${r.frames.length}, step ${r.frames[i].step}`);
        map.setAttribute('aria-label', `KV block pool at step ${r.frames[i].step}`);
      };
      onInput = draw;
      slider.addEventListener('input', onInput);
      draw();
      bytesBars(el, r);
    },
    clear() { drop(); clear(el); },
    destroy() { drop(); clear(el); },
  };
}
