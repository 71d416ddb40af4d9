// "What each new token read": while a lab run streams with `"inspect": {"attention": true}`, the
// token strip (prompt + answer, coloured by source as in "What the model reads") lights the cached
// positions the newest token's query weighted most, for one layer (slider) or all layers, over the
// heads' mean or the sharpest head; pointing at or focusing an answer token shows what it read.
// mount(el)/destroy() as every figure; the lab calls prepare(payload) before a run and apply(event)
// for each of its events. The weights are measured: the server takes them inside the model's forward.
// The strip itself is shared with the walkthrough (shared/attention-strip.js).
import { defineFigure } from '../shared/figure.js';
import { HEAD_MODES, applyAttentionEvent, createAttention, readSentence, readView, withPrompt } from '../shared/attention.js';
import { createAttentionStrip, showLayer, sliderLayer } from '../shared/attention-strip.js';
import { describePrompt } from './api.js';

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
  const caption = $('#lab-attn-caption');
  const strip = createAttentionStrip($('#lab-attn-strip'), { listen: figure.listen, onPin: () => paint() });
  let state = createAttention();
  let runs = 0; // a prompt description that comes back after the next run has started is dropped

  const mode = () => el.querySelector('input[name="lab-attn-heads"]:checked')?.value || HEAD_MODES.MEAN;

  function paint() {
    const layer = sliderLayer(slider);
    const view = readView(state, { pinned: strip.pinned(), layer, mode: mode() });
    strip.light(view.levels, view.query);
    showLayer(slider, layerOut);
    if (view.index != null) caption.textContent = readSentence(state, view, layer);
    else caption.textContent = toggle.checked ? 'Run to see what each new token reads.' : 'Tick the box, then run.';
  }

  figure.listen(slider, 'input', paint);
  figure.listen(el, 'change', paint);

  return {
    prepare(payload) {
      if (!toggle.checked) return payload;
      state = createAttention();
      strip.reset();
      strip.render(state);
      paint();
      const run = ++runs;
      describePrompt(payload).then((result) => {
        if (!figure.alive || run !== runs || !result.ok) return;
        state = withPrompt(state, result.data.tokens);
        strip.render(state);
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
      showLayer(slider, layerOut, state.layers);
      if (grew) strip.render(state);
      paint();
    },
  };
}
