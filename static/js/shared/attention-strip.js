// The token strip of "what each new token read", shared by the lab view (lab/attention-view.js) and
// the walkthrough's decode and cache stages (walkthrough/attention.js): the prompt and the answer as
// text pieces coloured by where they came from, the cached positions a token read most washed in
// orange (stronger for more weight), the query outlined. Pointing at or focusing an answer piece pins
// it; the owner repaints with what that token read. Model text goes in with textContent only.
import { html } from './dom.js';
import { ALL_LAYERS, LEVELS, layerLabel } from './attention.js';

const READ_RGB = '234, 88, 12'; // an orange wash over the source colour, stronger for more weight

// strip: the element to fill; listen: a figure's listen (shared/figure.js), so destroy() unhooks it;
// onPin(index | null) after the pinned answer token changes; answerClass: how answer pieces are
// coloured (the lab: as the assistant, the walkthrough: as generated tokens).
export function createAttentionStrip(strip, { listen, onPin, answerClass = 'src-assistant' }) {
  let spans = [];
  let pinned = null;

  function piece(text, cls) {
    return html('span', { cls: `ptok ${cls}`, text: text.replace(/\n/g, '↵\n') || '·' });
  }

  function answerPiece(token) {
    const span = piece(token.text, `${answerClass} attn-answer`);
    span.tabIndex = 0;
    span.dataset.index = String(token.index);
    span.setAttribute('aria-label', `answer token ${token.index}: show what it read`);
    return span;
  }

  // state: shared/attention.js; `answer` limits the answer pieces shown (a stage may show fewer).
  function render(state, answer = state.answer) {
    const frag = document.createDocumentFragment();
    spans = [...(state.prompt || []).map((t) => piece(t.text, `src-${t.source}`)), ...answer.map(answerPiece)];
    spans.forEach((span, position) => { span.dataset.position = String(position); frag.appendChild(span); });
    strip.replaceChildren(frag);
    if (pinned != null && !answer.some((t) => t.index === pinned)) pinned = null;
  }

  // levels: position → 1…LEVELS (shared/attention.js highlightLevels); query: the outlined position.
  function light(levels, query) {
    spans.forEach((span, position) => {
      const level = levels.get(position) || 0;
      const alpha = level / LEVELS;
      span.dataset.read = String(level);
      span.style.backgroundImage = level ? `linear-gradient(rgba(${READ_RGB}, ${alpha}), rgba(${READ_RGB}, ${alpha}))` : '';
      span.style.outline = position === query ? '2px solid currentColor' : '';
    });
  }

  function pin(ev) {
    const index = ev.target?.dataset?.index;
    if (index == null || Number(index) === pinned) return;
    pinned = Number(index);
    onPin(pinned);
  }

  function unpin() {
    if (pinned == null) return;
    pinned = null;
    onPin(null);
  }

  listen(strip, 'mouseover', pin);
  listen(strip, 'focusin', pin);
  listen(strip, 'mouseleave', unpin);
  listen(strip, 'focusout', unpin);

  return {
    render,
    light,
    pinned: () => pinned,
    reset() { pinned = null; },
  };
}

// The layer a slider names: 0 is "all layers" (their mean), k is layer k (counted from 1 on screen).
export function sliderLayer(slider) {
  const value = Number(slider.value);
  return value === 0 ? ALL_LAYERS : value - 1;
}

// Keeps a layer slider (a native range: the APG slider's role and aria-valuenow/min/max) and its
// <output> in step: `layers` sets its range once known, and aria-valuetext says the layer in words.
export function showLayer(slider, out, layers = null) {
  if (layers != null) slider.max = String(layers);
  const label = layerLabel(sliderLayer(slider));
  out.textContent = label;
  slider.setAttribute('aria-valuetext', label);
}
