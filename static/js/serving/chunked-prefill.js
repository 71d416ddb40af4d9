// Stage 4 figure: the gaps between the tokens of requests already decoding while a long prompt is
// prefilled, with chunked prefill off and on (one column per gap, the same scale for both runs), and
// the long prompt's own time to first token in each run.
import { html } from '../shared/dom.js';
import { formatInt, formatMs } from '../shared/format.js';
import { clear, readouts, setting, value } from './view.js';

const RUNS = [['off', 'Chunking off'], ['on', 'Chunking on']];

function gapColumns(parent, gaps, top, name) {
  const box = html('div', { cls: 'sv-gaps', parent });
  box.dataset.run = name;
  gaps.forEach((row, r) => {
    const line = html('div', { cls: 'sv-gap-row', parent: box });
    line.setAttribute('role', 'img');
    line.setAttribute('aria-label', `decoding request ${r + 1}: gaps ${row.map((g) => formatMs(g)).join(', ')}`);
    for (const g of row) {
      const col = html('span', { cls: 'sv-gap', parent: line });
      col.style.height = `${top > 0 ? (g / top) * 100 : 0}%`;
      col.dataset.value = String(g);
      col.title = formatMs(g);
    }
  });
  return box;
}

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const r = response.result;
      const all = RUNS.flatMap(([k]) => (r.runs[k]?.gaps_ms || []).flat());
      const top = Math.max(0, ...all);
      const head = html('p', { cls: 'sv-note', parent: el });
      head.append('A ');
      value(head, `${formatInt(r.long_prompt_tokens)}-token`, 'measured');
      head.append(' prompt arrives while others decode; chunks of ');
      setting(head, `${formatInt(r.chunk_size)} tokens`);
      head.append('. Each column is one gap between two tokens; the tallest is ');
      value(head, formatMs(top), 'measured');
      head.append('.');
      const pair = html('div', { cls: 'sv-pair is-tight', parent: el });
      for (const [name, title] of RUNS) {
        const run = r.runs[name];
        if (!run) continue;
        const col = html('div', { cls: 'sv-col', parent: pair });
        col.dataset.run = name;
        html('p', { cls: 'sv-sub', text: title, parent: col });
        gapColumns(col, run.gaps_ms, top, name);
        readouts(col, [
          ['longest gap', formatMs(run.max_gap_ms), 'measured', 'max'],
          ['p95 gap', formatMs(run.p95_gap_ms), 'measured', 'p95'],
          ['long prompt TTFT', formatMs(run.long_ttft_ms), 'measured', 'ttft'],
        ]);
      }
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
