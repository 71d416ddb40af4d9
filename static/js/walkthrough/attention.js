// "What the newest token read", in the walkthrough's decode and cache stages: from the `attention`
// events of the run on display (the recorded trace, a live run or one from the lab), the token strip
// lights the cached positions the newest token's query weighted most, for the layer the slider picks
// or all layers, and so do the figure's token cells and cache columns; pointing at or focusing an answer token shows
// what it read. The weights are measured (inside the model's forward, docs/protocol.md "attention");
// the block says where and when. The strip is the lab's (shared/attention-strip.js).
import { attentionOfEvents, readSentence, readView } from '../shared/attention.js';
import { createAttentionStrip, showLayer, sliderLayer } from '../shared/attention-strip.js';
import { finder } from '../shared/dom.js';
import { recordedOnText } from './context.js';

export const ATTENTION_STAGES = new Set(['decode', 'cache']);

// The request a live run sends: the example's, with inspection on where the engine can provide it
// (a remote server's attention is not visible: it would refuse the request, docs/protocol.md).
export function liveRequest(request, facts) {
  const { inspect, ...rest } = request;
  if (facts && facts.engine === 'openai') return rest;
  return { ...rest, inspect: { ...(inspect || {}), attention: true } };
}

// Where and when the weights on display were measured, in words: [the short part, the details a
// phone leaves out].
export function measuredWhere(source, run) {
  const day = run.recordedAt ? run.recordedAt.slice(0, 10) : null;
  if (source === 'live') return ['in this live run', ', inside the running model’s forward pass'];
  if (source === 'imported') return [`in a lab run${day ? ` of ${day}` : ''}`, ''];
  return [`when recorded${day ? `, ${day}` : ''}`, ` · ${recordedOnText(run)}`];
}

// Why a run on display has nothing to show, or null when it has attention events.
function absentReason(source, run, state) {
  if (Object.keys(state.reads).length) return null;
  if (run.model && run.model.engine === 'openai') return 'A remote server does not show its attention weights.';
  if (source === 'live' && !run.tokens.length) return 'Waiting for the first token…';
  return 'This run was made without attention inspection, so there is nothing to light.';
}

// rows(): the figure's groups of per-position marks, each a list where item i is position i (the token
// row's cells, the cache lane's columns), lit like the strip's pieces.
export function createAttentionBlock(block, figure, rows) {
  const q = finder(block);
  const el = { slider: q('.wt-attn-layer'), out: q('.wt-attn-layer-out'), caption: q('.wt-attn-caption'),
    where: q('.wt-attn-where'), whereDetail: q('.wt-attn-where-detail'), body: q('.wt-attn-body'), tag: q('.tag'),
    strip: q('.wt-attn-strip') };
  const strip = createAttentionStrip(el.strip, { listen: figure.listen, onPin: () => paint(), answerClass: 'src-gen' });
  let state = null;
  let shown = []; // the answer tokens the stage shows

  function paint() {
    if (!state) return;
    const layer = sliderLayer(el.slider);
    const view = readView(state, { pinned: strip.pinned(), layer, newest: shown.length ? shown[shown.length - 1].index : null });
    strip.light(view.levels, view.query);
    for (const marks of rows()) lightMarks(marks, view.levels, view.query);
    showLayer(el.slider, el.out);
    el.caption.textContent = view.index == null ? '' : readSentence(state, view, layer);
  }

  // trace: the run on display (its prompt and events); state: the figure's (stages.js figureState).
  function update(trace, figureState, run) {
    // Only a run with measured events can have measured reads: the schematic stand-in shows none.
    const on = ATTENTION_STAGES.has(figureState.name) && !!trace && run.measured;
    block.hidden = !on;
    block.closest('.wt-figure').toggleAttribute('data-attn', on);
    if (!on) { state = null; unlight(); return; }
    state = attentionOfEvents((trace.prompt && trace.prompt.tokens) || [], trace.events);
    shown = state.answer.slice(0, figureState.generated);
    const absent = absentReason(figureState.source, run, state);
    el.body.hidden = !!absent;
    el.tag.hidden = !!absent;
    [el.where.textContent, el.whereDetail.textContent] = absent ? ['', ''] : measuredWhere(figureState.source, run);
    if (absent) { el.caption.textContent = absent; unlight(); return; }
    showLayer(el.slider, el.out, state.layers);
    strip.render(state, shown);
    if (strip.pinned() == null) el.strip.scrollTop = el.strip.scrollHeight; // the newest token in view
    paint();
  }

  const unlight = () => { for (const marks of rows()) lightMarks(marks, new Map(), null); };

  figure.listen(el.slider, 'input', paint);
  return { update };
}

function lightMarks(marks, levels, query) {
  marks.forEach((mark, position) => {
    const level = levels.get(position);
    if (level) mark.dataset.read = String(level);
    else delete mark.dataset.read;
    mark.classList.toggle('is-query', position === query);
  });
  if (marks.length) marks[0].parentNode.classList.toggle('has-reads', levels.size > 0);
}
