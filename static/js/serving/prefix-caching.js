// Stage 5 figure: requests sharing one system prompt, with prefix caching off and on: each request's
// time to first token (bars on one scale), prefill tokens computed, tokens found in the cache and
// KV blocks shared.
import { html } from '../shared/dom.js';
import { formatInt, formatMs } from '../shared/format.js';
import { barRow, clear, table, value } from './view.js';
import { share } from './math.js';

const RUNS = [['off', 'Prefix caching off'], ['on', 'Prefix caching on']];

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const r = response.result;
      const ttfts = RUNS.flatMap(([k]) => (r.runs[k]?.requests || []).map((q) => q.ttft_ms));
      const head = html('p', { cls: 'sv-note', parent: el });
      head.append('Every request starts with the same ');
      value(head, `${formatInt(r.system_prompt_tokens)}-token`, 'measured');
      head.append(' system prompt, then its own question.');
      const pair = html('div', { cls: 'sv-pair is-tight', parent: el });
      for (const [name, title] of RUNS) {
        const run = r.runs[name];
        if (!run) continue;
        const col = html('div', { cls: 'sv-col', parent: pair });
        col.dataset.run = name;
        html('p', { cls: 'sv-sub', text: `${title}: time to first token`, parent: col });
        const bars = html('div', { cls: 'sv-bars', parent: col });
        run.requests.forEach((q, i) => barRow(bars, { label: `request ${i + 1}`, fraction: share(q.ttft_ms, ttfts),
          text: formatMs(q.ttft_ms), cls: 'sv-ttft', data: { value: q.ttft_ms } }));
        table(col, {
          head: ['', 'prefilled', 'from cache', 'shared blocks'],
          rows: run.requests.map((q, i) => [`#${i + 1}`, [formatInt(q.prefill_tokens), 'measured'],
            [formatInt(q.cached_tokens), 'measured'], [formatInt(q.shared_blocks), 'measured']]),
        });
      }
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
