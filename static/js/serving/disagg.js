// Stage 8 figure, SCHEMATIC: prefill and decode on separate machines with the KV cache handed from
// one to the other, beside the same work on one machine. No timing meaning; the one measured number
// is the stall from the chunked_prefill experiment (, chunking off) that motivates the split.
import { html, svgEl } from '../shared/dom.js';
import { formatMs } from '../shared/format.js';
import { clear, value } from './view.js';

function box(svg, x, y, w, h, cls, text) {
  const g = svgEl('g', { class: `sv-machine ${cls}` }, { parent: svg });
  svgEl('rect', { x, y, width: w, height: h, rx: 6 }, { parent: g });
  svgEl('text', { x: x + w / 2, y: y + h / 2 + 4, 'text-anchor': 'middle' }, { text, parent: g });
  return g;
}

function diagram(parent) {
  const svg = svgEl('svg', { viewBox: '0 0 420 180', class: 'sv-disagg', role: 'img',
    'aria-label': 'Schematic: one machine doing both phases, against a prefill machine passing the KV cache to a decode machine' },
  { parent });
  svgEl('text', { x: 8, y: 16, class: 'sv-axis-title' }, { text: 'one machine, both phases', parent: svg });
  box(svg, 8, 24, 404, 40, 'is-both', 'prefill and decode share each step');
  svgEl('text', { x: 8, y: 92, class: 'sv-axis-title' }, { text: 'split: each phase on its own machine', parent: svg });
  box(svg, 8, 100, 150, 54, 'is-prefill', 'prefill machine');
  box(svg, 262, 100, 150, 54, 'is-decode', 'decode machine');
  svgEl('path', { d: 'M 162 127 L 254 127', class: 'sv-kv-arrow', 'marker-end': 'url(#sv-arrow)' }, { parent: svg });
  const defs = svgEl('defs', {}, { parent: svg });
  const marker = svgEl('marker', { id: 'sv-arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7,
    orient: 'auto' }, { parent: defs });
  svgEl('path', { d: 'M0,0 L10,5 L0,10 z', class: 'sv-arrow-head' }, { parent: marker });
  svgEl('text', { x: 208, y: 120, 'text-anchor': 'middle', class: 'sv-kv-label' }, { text: 'KV cache', parent: svg });
  return svg;
}

export function mount(el) {
  return {
    // `response` is experiment 4's (chunked_prefill), or null: the diagram never depends on it.
    show(response) {
      clear(el);
      // The source line above says "schematic"; this says what that means here.
      html('p', { cls: 'sv-note', text: 'The boxes and the arrow show who does what, not how long it takes.', parent: el });
      diagram(el);
      const tie = html('p', { cls: 'sv-note sv-tie', parent: el });
      const off = response?.result?.runs?.off;
      if (off) {
        tie.append('The reason to split: in the chunked-prefill experiment, with chunking off, one long prefill held the other requests’ next token for up to ');
        value(tie, formatMs(off.max_gap_ms), 'measured');
        tie.append('.');
      } else {
        tie.append('The reason to split is the chunked-prefill stage’s stall: a long prefill holds up every request that is decoding beside it.');
      }
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
