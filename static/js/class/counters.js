// The counters: waiting, running, finished, cancelled, aggregate tokens/s, TTFT and TPOT p50/p95 over
// the last minute and the feed's losses, from the server's `class_stats` (measured by the engine);
// waiting/running from the newer of that and the last engine step (both the engine's own counts, the
// step's fresher), endings as class_stats counted them plus those the feed brought since.
import { defineFigure } from '../shared/figure.js';
import { MISSING, formatFixed, formatInt } from '../shared/format.js';
import { followState } from './feed.js';
import { endings } from './feed-state.js';

// Whole milliseconds without the unit: the label says "ms" once for the pair.
const pct = (s, name, p) => formatFixed(s?.[name]?.[p], 0);

function values(state) {
  const s = state.stats;
  const ends = endings(state);
  return {
    waiting: formatInt(state.waiting),
    running: formatInt(state.running),
    finished: formatInt(ends.finished),
    cancelled: formatInt(ends.cancelled),
    errors: formatInt(ends.error),
    tokens_per_s: s ? formatFixed(s.tokens_per_s, 1) : MISSING,
    ttft_p50: pct(s, 'ttft_ms', 'p50'),
    ttft_p95: pct(s, 'ttft_ms', 'p95'),
    tpot_p50: pct(s, 'tpot_ms', 'p50'),
    tpot_p95: pct(s, 'tpot_ms', 'p95'),
    dropped: formatInt(Math.max(state.dropped, s?.feed_dropped ?? 0)),
  };
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const slots = [...el.querySelectorAll('[data-counter]')];
  const windowNote = el.querySelector('[data-stats-window]');
  followState(figure, (state) => {
    const v = values(state);
    for (const slot of slots) slot.textContent = v[slot.dataset.counter] ?? MISSING;
    if (windowNote) {
      windowNote.textContent = state.stats
        ? `over the last ${state.stats.window_s ?? 60} s; tokens/s over the last 10 s`
        : 'waiting for the server\'s first statistics…';
    }
    el.dataset.dropped = String(Math.max(state.dropped, state.stats?.feed_dropped ?? 0) > 0);
  });
});
