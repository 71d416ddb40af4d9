// The KV-memory calculator figure: mount(el) loads the presets and golden cases from
// static/data/kv_golden.json, binds the template's controls to one state object, redraws every
// read-out from it, and mirrors it into the query string; destroy() undoes all of that.
import { currentModel } from '../model-status.js';
import { html } from '../shared/dom.js';
import { defineFigure } from '../shared/figure.js';
import { billions, formatBytes, formatInt, plural } from '../shared/format.js';
import { renderAllocation } from './allocation.js';
import { bytesNode } from './bytes.js';
import { renderFit } from './fit.js';
import { attentionKind, kvBytesPerToken } from './kv-math.js';
import { createLiveCheck } from './live-check.js';
import { createSlider } from './slider.js';
import { BLOCK_SIZES, LIMITS, fromPreset, parse, parseMix, readInt, readNum, write } from './state.js';
import { renderTiles } from './tiles.js';

const DATA_URL = new URL('../../data/kv_golden.json', import.meta.url);
const ARCH_FIELDS = ['layers', 'heads', 'kvHeads', 'headDim', 'dtype'];

export const { mount, destroy } = defineFigure((root, figure) => {
  fetch(DATA_URL, { signal: figure.signal })
    .then((res) => {
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      return res.json();
    })
    .then((golden) => { if (figure.alive) start(root, golden, figure); })
    .catch((err) => {
      if (!figure.alive) return; // destroyed: the fetch was aborted on purpose
      root.querySelector('[data-out="loading"]').textContent = `The calculator could not load its data (${err.message}).`;
    });
});

// Everything here listens through `figure`, so destroy() removes it all.
function start(root, golden, figure) {
  const field = (name) => root.querySelector(`[data-field="${name}"]`);
  const out = (name) => root.querySelector(`[data-out="${name}"]`);
  const elementTypes = golden.element_types;
  const bytesOf = (id) => elementTypes.find((e) => e.id === id).bytes;
  const presets = golden.presets;
  let livePreset = null;
  let state = parse(new URLSearchParams(location.search), presets, elementTypes.map((e) => e.id));

  fillSelects(root, field, elementTypes, presets);

  function presetById(id) {
    return id === 'live' ? livePreset : presets.find((p) => p.id === id);
  }

  // A user change: new state, every read-out redrawn, the URL updated for sharing. Editing an
  // architecture field by hand turns the preset into "custom".
  function update(patch) {
    state = { ...state, ...patch };
    if (!('preset' in patch) && ARCH_FIELDS.some((f) => f in patch)) state.preset = 'custom';
    render();
    const url = new URL(location.href);
    write(url.searchParams, state);
    history.replaceState(history.state, '', url);
  }

  const sliders = {
    ctx: createSlider(root.querySelector('[data-slider="ctx"]'), {
      min: LIMITS.ctx[0], max: LIMITS.ctx[1], valueText: (v) => plural(v, 'token'), onChange: (v) => update({ ctx: v }),
    }, figure),
    seq: createSlider(root.querySelector('[data-slider="seq"]'), {
      min: LIMITS.seq[0], max: LIMITS.seq[1], valueText: (v) => plural(v, 'sequence'), onChange: (v) => update({ seq: v }),
    }, figure),
  };

  const mixHelp = `Give 1 to ${LIMITS.mixCount[1]} whole numbers from 1 to ${formatInt(LIMITS.mixLen[1])}, separated by commas.`;
  bindInputs(field, update, () => state, figure, (name, ok) => {
    if (name === 'mix') out('mix-error').textContent = ok ? '' : mixHelp;
  });
  figure.listen(field('preset'), 'change', (ev) => {
    const preset = presetById(ev.target.value);
    update(preset ? fromPreset(state, preset) : { preset: 'custom' });
  });

  const live = createLiveCheck(out('live-part'), figure);
  function onModel(info) {
    live.setModel(info);
    if (!info || info.status !== 'ready') return;
    livePreset = presetFromFacts(info.facts, elementTypes);
    const option = field('preset').querySelector('option[value="live"]');
    option.disabled = false;
    option.textContent = livePreset.label;
    render();
  }
  figure.listen(document, 'kvscope:model', (ev) => onModel(ev.detail));
  onModel(currentModel());

  function render() {
    const arch = { layers: state.layers, kvHeads: state.kvHeads, headDim: state.headDim, bytesPerElement: bytesOf(state.dtype) };
    const bpt = kvBytesPerToken(arch);
    const preset = presetById(state.preset);
    showValues(field, state, sliders);
    renderPresetCard(out('preset-card'), preset, elementTypes);
    renderKind(out('attention-kind'), state);
    // The attention kind and the window note restate the chosen model's numbers: same provenance as its card
    // (your own numbers, with no preset, are a hypothetical model).
    const kind = presetKind(preset);
    out('attention-kind').dataset.provenance = kind;
    out('ctx-note').dataset.provenance = kind;
    out('ctx-note').textContent = preset && preset.context_window && state.ctx > preset.context_window
      ? `Beyond this model's context window of ${formatInt(preset.context_window)} positions: arithmetic only.` : '';
    renderFormula(out('formula'), arch, bpt, state);
    out('per-token').replaceChildren(bytesNode(bpt));
    out('per-seq').replaceChildren(bytesNode(bpt * state.ctx));
    out('total').replaceChildren(bytesNode(bpt * state.ctx * state.seq));
    renderTiles(out('tiles'), out('tiles-caption'), { ctx: state.ctx, seq: state.seq, block: state.block, bytesPerToken: bpt });
    renderAllocation(out('alloc'), out('alloc-table'), { mix: state.mix, block: state.block, ctx: state.ctx, bytesPerToken: bpt });
    renderFit({ weights: out('weights'), membar: out('membar'), membarLegend: out('membar-legend'), fit: out('fit') }, {
      params: state.params, weightBytesPerElement: bytesOf(state.wdtype), memGiB: state.mem, bytesPerToken: bpt,
      ctx: state.ctx, seq: state.seq, contextWindow: preset ? preset.context_window : null,
    });
  }

  render();
  out('loading').hidden = true;
  for (const name of ['body', 'alloc-part', 'fit-part', 'live-part']) out(name).hidden = false;
  root.dataset.ready = 'true';
}

function fillSelects(root, field, elementTypes, presets) {
  for (const select of root.querySelectorAll('[data-element-select]')) {
    select.replaceChildren(...elementTypes.map((e) => new Option(`${e.label} (${e.bytes} B)`, e.id)));
  }
  field('block').replaceChildren(...BLOCK_SIZES.map((b) => new Option(plural(b, 'token'), String(b))));
  const live = new Option('Live model (waiting for the server)', 'live');
  live.disabled = true;
  field('preset').replaceChildren(...presets.map((p) => new Option(p.label, p.id)), live, new Option('Custom', 'custom'));
}

// Text and number fields update the state on every valid keystroke; an invalid entry is marked (and
// reported through onValidity) and, when the field is left, replaced by the last valid value.
function bindInputs(field, update, getState, figure, onValidity) {
  const parsers = {
    heads: (t) => (t === '' ? null : readInt(t, LIMITS.heads)),
    params: (t) => {
      if (t === '') return null;
      const b = readNum(t, [0, LIMITS.params[1] / 1e9]);
      return b === undefined ? undefined : Math.round(b * 1e9);
    },
    mem: (t) => readNum(t, LIMITS.mem),
    mix: parseMix,
  };
  for (const name of ['layers', 'kvHeads', 'headDim', 'ctx', 'seq']) parsers[name] = (t) => readInt(t, LIMITS[name]);

  for (const [name, parseText] of Object.entries(parsers)) {
    const input = field(name);
    figure.listen(input, 'input', () => {
      const v = parseText(input.value.trim());
      const ok = v !== undefined;
      input.setAttribute('aria-invalid', String(!ok));
      onValidity(name, ok);
      if (ok) update({ [name]: v });
    });
    figure.listen(input, 'change', () => {
      input.setAttribute('aria-invalid', 'false');
      onValidity(name, true);
      showField(input, name, getState());
    });
  }
  for (const name of ['dtype', 'wdtype']) figure.listen(field(name), 'change', (ev) => update({ [name]: ev.target.value }));
  figure.listen(field('block'), 'change', (ev) => update({ block: Number(ev.target.value) }));
}

function fieldText(name, state) {
  if (name === 'params') return billions(state.params);
  if (name === 'mix') return state.mix.join(', ');
  return state[name] == null ? '' : String(state[name]);
}

function showField(input, name, state) {
  input.value = fieldText(name, state);
}

// Puts the state into every control, except the one being typed in (rewriting it would fight the
// user: "8." is a valid 8 on its way to 8.03).
function showValues(field, state, sliders) {
  for (const name of ['layers', 'heads', 'kvHeads', 'headDim', 'ctx', 'seq', 'params', 'mem', 'mix', 'dtype', 'wdtype', 'block', 'preset']) {
    const input = field(name);
    if (input !== document.activeElement) showField(input, name, state);
  }
  sliders.ctx.set(state.ctx);
  sliders.seq.set(state.seq);
}

function renderFormula(el, arch, bpt, state) {
  const perToken = `2 (K and V) × ${formatInt(arch.layers)} layers × ${formatInt(arch.kvHeads)} KV heads × `
    + `${formatInt(arch.headDim)} head dim × ${arch.bytesPerElement} B = ${formatBytes(bpt)} per token`;
  const total = `${formatBytes(bpt)} × ${plural(state.ctx, 'token')} × ${plural(state.seq, 'sequence')} = `
    + `${formatBytes(bpt * state.ctx * state.seq)}`;
  el.replaceChildren(...[perToken, total].map((text) => html('span', { cls: 'kvc-formula-line', text })));
}

function renderKind(el, { heads, kvHeads }) {
  const kind = attentionKind(heads, kvHeads);
  const texts = {
    MHA: `MHA (multi-head attention): each of the ${formatInt(heads)} query heads has its own key/value head.`,
    GQA: `GQA (grouped-query attention): ${formatInt(heads)} query heads share ${formatInt(kvHeads)} KV heads, `
      + `so the cache is ${formatInt(heads / kvHeads)}× smaller than with one KV head per query head.`,
    MQA: `MQA (multi-query attention): all ${formatInt(heads)} query heads share one KV head, `
      + `so the cache is ${formatInt(heads)}× smaller than with one per query head.`,
  };
  if (kind && kind !== 'MHA' && heads % kvHeads !== 0) {
    el.textContent = `${formatInt(heads)} query heads do not split evenly over ${formatInt(kvHeads)} KV heads; the arithmetic still runs.`;
  } else if (kind) el.textContent = texts[kind];
  else if (heads == null) el.textContent = 'Query-head count not given: the cache depends only on the KV heads.';
  else el.textContent = 'More KV heads than query heads is not a real configuration; the arithmetic still runs.';
}

function presetKind(preset) {
  if (!preset) return 'hypothetical';
  if (preset.id === 'live') return 'measured';
  return preset.hypothetical ? 'hypothetical' : 'cited';
}

function renderPresetCard(el, preset, elementTypes) {
  if (!preset) {
    el.replaceChildren(html('p', { text: 'Custom: your own numbers.' }));
    return;
  }
  const type = elementTypes.find((e) => e.id === preset.dtype);
  const numbers = [
    plural(preset.layers, 'layer'),
    preset.attention_heads ? plural(preset.attention_heads, 'query head') : 'query heads not given',
    plural(preset.kv_heads, 'KV head'), `head dim ${formatInt(preset.head_dim)}`, `${type.label} (${type.bytes} B)`,
    preset.params ? `${formatInt(preset.params)} parameters` : 'parameters not given',
    preset.context_window ? `context window ${formatInt(preset.context_window)}` : 'context window not given',
  ];
  const live = preset.id === 'live';
  // Where the card's numbers come from: read off the live model, a hypothetical worked example, or a cited config.
  const kind = presetKind(preset);
  const source = html('p', { cls: 'kvc-card-source' });
  source.dataset.provenance = kind;
  source.append(html('span', { cls: `tag tag-${kind}`, text: kind }), ' Source: ');
  if (preset.source.url) {
    const a = html('a', { text: preset.source.name });
    a.href = preset.source.url;
    source.append(a);
  } else source.append(preset.source.name);
  source.append(preset.note ? `. ${preset.note}` : '.');
  const card = html('p', { cls: 'kvc-card-numbers', text: `${numbers.join(' · ')} → ${formatBytes(preset.bytes_per_token)} per token` });
  card.dataset.provenance = kind;
  el.replaceChildren(card, source);
}

function presetFromFacts(f, elementTypes) {
  const type = elementTypes.find((e) => e.bytes === f.bytes_per_element) || elementTypes[0];
  return {
    id: 'live', label: `Live model: ${f.name} (${f.dtype})`, layers: f.layers, attention_heads: f.attention_heads,
    kv_heads: f.kv_heads, head_dim: f.head_dim, dtype: type.id, params: f.params, context_window: f.context_window,
    bytes_per_token: f.kv_bytes_per_token,
    source: { name: `the model running behind this page, as it reports itself (/api/model), on ${f.device_name || f.device}`, url: null },
    note: null,
  };
}
