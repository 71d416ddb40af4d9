// A log-scale slider on the W3C APG slider pattern: role=slider with aria-valuemin/max/now/valuetext,
// arrows step one stop, PageUp/PageDown double or halve, Home/End jump to the ends, and a pointer
// (mouse, pen or touch) drags along the track. The element and its thumb come from the template;
// its listeners go through the calculator's `figure` (shared/figure.js), so they end with it.
import { doubleStop, fraction, ladder, stepStop, stopAt } from './ladder.js';

export function createSlider(el, { min, max, valueText, onChange }, figure) {
  const stops = ladder(min, max);
  let value = min;
  el.setAttribute('aria-valuemin', String(min));
  el.setAttribute('aria-valuemax', String(max));

  function render() {
    el.setAttribute('aria-valuenow', String(value));
    el.setAttribute('aria-valuetext', valueText(value));
    el.style.setProperty('--pos', String(fraction(value, min, max)));
  }

  function commit(next) {
    if (next === value) return;
    value = next;
    render();
    onChange(value);
  }

  const KEYS = {
    ArrowRight: () => stepStop(stops, value, 1), ArrowUp: () => stepStop(stops, value, 1),
    ArrowLeft: () => stepStop(stops, value, -1), ArrowDown: () => stepStop(stops, value, -1),
    PageUp: () => doubleStop(stops, value, 1), PageDown: () => doubleStop(stops, value, -1),
    Home: () => min, End: () => max,
  };

  function onKey(ev) {
    const next = KEYS[ev.key];
    if (!next) return;
    ev.preventDefault();
    commit(next());
  }

  // The thumb's centre travels from half a thumb inside the left edge to half a thumb inside the
  // right one, so the pointer maps over that span: a click on the thumb keeps its value.
  function fromPointer(ev) {
    const box = el.getBoundingClientRect();
    const thumb = el.querySelector('.kvc-slider-thumb').offsetWidth;
    commit(stopAt(stops, (ev.clientX - box.left - thumb / 2) / (box.width - thumb)));
  }

  function onDown(ev) {
    if (ev.button !== 0) return;
    el.setPointerCapture(ev.pointerId);
    el.focus();
    fromPointer(ev);
  }

  function onMove(ev) {
    if (el.hasPointerCapture(ev.pointerId)) fromPointer(ev);
  }

  figure.listen(el, 'keydown', onKey);
  figure.listen(el, 'pointerdown', onDown);
  figure.listen(el, 'pointermove', onMove);

  return {
    // Shows a value set elsewhere (a number field, a preset, the URL) without calling onChange.
    set(v) { value = v; render(); },
  };
}
