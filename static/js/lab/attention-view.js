// "What each new token read": while a lab run streams with `"inspect": {"attention": true}`, the
// token strip (prompt + answer, coloured by source as in "What the model reads") lights the cached
// positions the newest token's query weighted most, for one layer (slider) or all layers, over the
// heads' mean or the sharpest head; pointing at or focusing an answer token shows what it read.
// mount(el)/destroy() as every figure; the lab calls prepare(payload) before a run and apply(event)
// for each of its events. The weights are measured: the server takes them inside the model's forward.
import { defineFigure } from '../shared/figure.js';
import { html } from '../shared/dom.js';
import {
  ALL_LAYERS, HEAD_MODES, applyAttentionEvent, createAttention, highlightLevels, layerLabel, newestIndex,
  positionOf, queryPosition, readsFor, withPrompt,
} from '../shared/attention.js';
import { describePrompt } from './api.js';

const READ_RGB = '234, 88, 12'; // an orange wash over the source colour, stronger for more weight
let active = null; // the mounted view's controls, for prepare() and apply()

export const { mount, destroy } = defineFigure((el, figure) => {
  active = createView(el, figure);
  figure.onDestroy(() => { active = null; });
});

// The payload the lab sends: with inspection when the box is ticked (and the view then starts over).
export function prepare(payload) {
  return active ? active.prepare(payload) : payload;
}

export function apply(event) {
  active?.apply(event);
}

function createView(el, figure) {
  const $ = (s) => el.querySelector(s);
  const toggle = $('#lab-attn-on');
  const slider = $('#lab-attn-layer');
  const layerOut = $('#lab-attn-layer-out');
  const strip = $('#lab-attn-strip');
  const caption = $('#lab-attn-caption');
  let state = createAttention();
  let pinned = null; // the answer token pointed at or focused; null = follow the newest
  let spans = [];
  let runs = 0; // a prompt description that comes back after the next run has started is dropped

  const layer = () => (Number(slider.value) === 0 ? ALL_LAYERS : Number(slider.value) - 1);
  const mode = () => el.querySelector('input[name="lab-attn-heads"]:checked')?.value || HEAD_MODES.MEAN;

  function renderStrip() {
    const frag = document.createDocumentFragment();
    spans = [...(state.prompt || []).map((t) => tokenSpan(t.text, `src-${t.source}`)),
      ...state.answer.map((t) => answerSpan(t))];
    spans.forEach((span, position) => { span.dataset.position = String(position); frag.appendChild(span); });
    strip.replaceChildren(frag);
  }

  function tokenSpan(text, cls) {
    return html('span', { cls: `ptok ${cls}`, text: text.replace(/\n/g, '↵\n') || '·' });
  }

  function answerSpan(token) {
    const span = tokenSpan(token.text, 'src-assistant lab-attn-answer');
    span.tabIndex = 0;
    span.dataset.index = String(token.index);
    span.setAttribute('aria-label', `answer token ${token.index}: show what it read`);
    return span;
  }

  function paint() {
    const index = pinned ?? newestIndex(state);
    const heads = layer() === ALL_LAYERS ? HEAD_MODES.MEAN : mode();
    const reads = index == null ? [] : readsFor(state, index, layer(), heads);
    const levels = highlightLevels(reads);
    const query = index == null ? null : queryPosition(state, index);
    spans.forEach((span, position) => {
      const level = levels.get(position) || 0;
      span.dataset.read = String(level);
      span.style.backgroundImage = level ? `linear-gradient(rgba(${READ_RGB}, ${level / 4}), rgba(${READ_RGB}, ${level / 4}))` : '';
      span.style.outline = position === query ? '2px solid currentColor' : '';
    });
    layerOut.textContent = layerLabel(layer());
    caption.textContent = describe(index, reads, heads);
  }

  function describe(index, reads, heads) {
    if (index == null) return toggle.checked ? 'Run to see what each new token reads.' : 'Tick the box, then run.';
    const who = heads === HEAD_MODES.SHARPEST ? 'its sharpest head' : 'the mean over heads';
    const most = reads.slice(0, 3).map(({ position, weight }) => {
      const at = positionOf(state, position);
      return `position ${position}${at ? ` “${at.text.trim() || at.text}” (${at.source})` : ''} ${(weight * 100).toFixed(1)} %`;
    });
    return `To choose answer token ${index}, ${layerLabel(layer())}, ${who}, read most: ${most.join('; ')}.`;
  }

  function pin(ev) {
    const index = ev.target?.dataset?.index;
    if (index == null) return;
    pinned = Number(index);
    paint();
  }

  figure.listen(strip, 'mouseover', pin);
  figure.listen(strip, 'focusin', pin);
  figure.listen(strip, 'mouseleave', () => { pinned = null; paint(); });
  figure.listen(strip, 'focusout', () => { pinned = null; paint(); });
  figure.listen(slider, 'input', paint);
  figure.listen(el, 'change', paint);

  return {
    prepare(payload) {
      if (!toggle.checked) return payload;
      state = createAttention();
      pinned = null;
      renderStrip();
      paint();
      const run = ++runs;
      describePrompt(payload).then((result) => {
        if (!figure.alive || run !== runs || !result.ok) return;
        state = withPrompt(state, result.data.tokens);
        renderStrip();
        paint();
      });
      return { ...payload, inspect: { attention: true } };
    },
    apply(event) {
      if (!toggle.checked) return;
      const next = applyAttentionEvent(state, event);
      if (next === state) return;
      const grew = next.answer.length !== state.answer.length;
      state = next;
      slider.max = String(state.layers);
      if (grew) renderStrip();
      paint();
    },
  };
}
