// The join panel: the address students open and its QR code (both rendered by the server into the
// template), plus how many laptops have the page open now (`laptops` from class_state).
import { defineFigure } from '../shared/figure.js';
import { finder } from '../shared/dom.js';
import { followState } from './feed.js';

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const count = q('[data-laptops]');
  const note = q('[data-laptops-note]');
  followState(figure, (state) => {
    const n = state.laptops;
    count.textContent = n == null ? '–' : String(n);
    note.textContent = n === 1 ? 'laptop connected' : 'laptops connected';
  });
});
