// The engine's batch-invariant mode, for the whole room: a line under the batch grid while the mode is on
// (what it does to the steps, and whether the engine's kernel check backs its promise), and, when the
// teacher switches it while the page watches, that the teacher did. Hidden while the mode is off and
// unswitched, and on a remote engine. modeLine() is pure; the figure only writes its text.
import { defineFigure } from '../shared/figure.js';
import { finder } from '../shared/dom.js';
import { followState } from './feed.js';

// The line for `mode` (the engine's report) and `switched` ({on} when the teacher changed it): '' for none.
export function modeLine(mode, switched) {
  if (!mode || mode.why_unavailable) return '';
  const start = switched ? 'The teacher turned batch-invariant mode' : 'Batch-invariant mode is';
  if (!mode.on) return switched ? `${start} off: requests share steps freely again.` : '';
  const rows = Number.isInteger(mode.rows) ? `${mode.rows} rows` : 'a fixed number of rows';
  let claim = 'the engine checks its kernels before the next step';
  if (mode.claimed === true) claim = 'each answer is the one it would get alone';
  if (mode.claimed === false) claim = "some kernels failed the engine's row check: no promise";
  return `${start} on: decode steps padded to ${rows}, prompts prefilled alone, no prefix caching (slower); `
    + `${claim}.`;
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const text = finder(el)('[data-mode-text]');
  followState(figure, (state) => {
    const line = modeLine(state.batchInvariant, state.modeSwitched);
    if (text.textContent !== line) text.textContent = line;
    el.hidden = line === '';
    el.dataset.on = String(!!state.batchInvariant?.on);
  });
});
