// The KV-memory calculator figure: mount(el) loads the presets and golden cases (static/data/kv_golden.json)
// and the bundled model configs (static/data/model-configs.json), binds the template's controls to one state
// object, redraws every read-out from it with the layer-group arithmetic (kv-layers.js), and mirrors it into
// the query string; destroy() undoes all of that. Input the arithmetic refuses leaves the last valid state shown.
import { currentModel } from '../model-status.js';
import { html } from '../shared/dom.js';
import { defineFigure } from '../shared/figure.js';
import { billions, formatBytes, formatInt, plural } from '../shared/format.js';
import { renderAllocation } from './allocation.js';
import { bytesNode } from './bytes.js';
import { bindConfigInput } from './config-input.js';
import { renderFit } from './fit.js';
import { renderFormula, renderGroupTable, renderKeys, renderNaive } from './groups.js';
import { attentionKind } from './kv-math.js';
import { KvInputError, cacheBytes, naiveBytes } from './kv-layers.js';
import { createLiveCheck } from './live-check.js';
import { resolveModel } from './model.js';
import { createSlider } from './slider.js';
import {
  BLOCK_SIZES, GROUP_SIZES, LIMITS, SCALE_BYTES, TP_SIZES, fromConfig, fromPreset, parse, parseMix, readInt, readNum, write,
} from './state.js';
import { renderTiles } from './tiles.js';
import { readConfig } from './kv-config.js';

const DATA_URL = new URL('../../data/kv_golden.json', import.meta.url);
const CATALOGUE_URL = new URL('../../data/model-configs.json', import.meta.url);
const ARCH_FIELDS = ['layers', 'heads', 'kvHeads', 'headDim'];
const STATE_TYPES = ['fp32', 'fp16', 'fp8']; // whole bytes: a recurrent state is not kept in 4 bits
// Where the live model's weight type (ModelFacts.weights_dtype) lands among the element types.
const WEIGHT_TYPES = { float32: 'fp32', bfloat16: 'fp16', float16: 'fp16', int8: 'int8', int4: 'int4' };

async function loadJson(url, signal) {
  const res = await fetch(url, { signal });
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  return res.json();
}

export const { mount, destroy } = defineFigure((root, figure) => {
  Promise.all([loadJson(DATA_URL, figure.signal), loadJson(CATALOGUE_URL, figure.signal)])
    .then(([golden, catalogue]) => { if (figure.alive) start(root, golden, catalogue.models, figure); })
    .catch((err) => {
      if (!figure.alive) return; // destroyed: the fetch was aborted on purpose
      root.querySelector('[data-out="loading"]').textContent = `The calculator could not load its data (${err.message}).`;
    });
});

// Everything here listens through `figure`, so destroy() removes it all.
function start(root, golden, catalogue, figure) {
  const field = (name) => root.querySelector(`[data-field="${name}"]`);
  const out = (name) => root.querySelector(`[data-out="${name}"]`);
  const elementTypes = golden.element_types;
  const bytesOf = (id) => elementTypes.find((e) => e.id === id).bytes;
  const presets = golden.presets;
  let livePreset = null;
  let liveApplied = false;
  let state = parse(new URLSearchParams(location.search), presets, elementTypes.map((e) => e.id), catalogue.map((m) => m.id));

  fillSelects(root, field, elementTypes, presets, catalogue);

  function presetById(id) {
    return id === 'live' ? livePreset : presets.find((p) => p.id === id);
  }

  const storageOf = (st) => ({
    kv_dtype: st.dtype, scale: st.scale, group_size: st.groupSize, scale_bytes: st.scaleBytes,
    block_size: st.round, tp: st.tp, state_bytes: bytesOf(st.sdtype),
  });

  // The exact answer for a state, or a KvInputError naming the field (the caller keeps the last valid state).
  function compute(st) {
    const model = resolveModel(st, catalogue);
    const storage = storageOf(st);
    const exact = cacheBytes(model.groups, st.ctx, st.seq, storage);
    return { model, storage, exact, naive: naiveBytes(model.naive, st.ctx, st.seq, st.dtype) };
  }

  function showError(err) {
    out('calc-error').textContent = err ? `${err.field}: ${err.reason}. The last valid numbers stay shown.` : '';
  }

  // A user change: new state, every read-out redrawn, the URL updated for sharing. Editing an
  // architecture field by hand turns the preset into "custom" (one group of full attention).
  function update(patch) {
    let next = { ...state, ...patch };
    if (!('preset' in patch) && ARCH_FIELDS.some((f) => f in patch)) next = { ...next, preset: 'custom', config: null };
    try {
      compute(next);
    } catch (err) {
      if (!(err instanceof KvInputError)) throw err;
      showError(err);
      render();
      return;
    }
    state = next;
    showError(null);
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
    const id = ev.target.value;
    const entry = catalogue.find((m) => `cfg:${m.id}` === id);
    if (entry) {
      update(fromConfig(state, id, readConfig(entry.config), entry.params));
      return;
    }
    const preset = presetById(id);
    update(preset ? fromPreset(state, preset) : { preset: 'custom', config: null });
  });
  bindConfigInput(root, figure, {
    onRead: (read, text) => update(fromConfig(state, 'pasted', read, state.params, text)),
    onError: (errors) => { out('config-error').textContent = errors.map((e) => `${e.field}: ${e.message}`).join(' · '); },
  });

  const live = createLiveCheck(out('live-part'), figure);
  function onModel(info) {
    live.setModel(info);
    if (!info || info.status !== 'ready') return;
    livePreset = presetFromFacts(info.facts, elementTypes);
    const option = field('preset').querySelector('option[value="live"]');
    option.disabled = false;
    option.textContent = livePreset.label;
    // A link that names the live model (?preset=live) gets its numbers once the server has said them.
    if (state.preset === 'live' && !liveApplied) update(fromPreset(state, livePreset));
    else render();
    liveApplied = true;
  }
  figure.listen(document, 'kvscope:model', (ev) => onModel(ev.detail));
  onModel(currentModel());

  function measuredWeights() {
    if (state.preset !== 'live' || !livePreset || state.params !== livePreset.params) return null;
    return { bytes: livePreset.weights_bytes, label: livePreset.weightsLabel };
  }

  function render() {
    const { model, storage, exact, naive } = compute(state);
    const preset = presetById(state.preset);
    const entry = model.entry;
    showValues(field, state, sliders);
    renderPresetCard(out('preset-card'), preset, elementTypes, entry, model.read);
    renderKind(out('attention-kind'), state, model);
    // The attention kind and the window note restate the chosen model's numbers: same provenance as its card.
    const kind = presetKind(preset, entry, model.read);
    const contextWindow = model.read ? model.read.contextWindow : preset && preset.context_window;
    out('attention-kind').dataset.provenance = kind;
    out('ctx-note').dataset.provenance = kind;
    out('ctx-note').textContent = contextWindow && state.ctx > contextWindow
      ? `Beyond this model's context window of ${formatInt(contextWindow)} positions: arithmetic only.` : '';
    renderFormula(out('formula'), model.groups, exact, storage, state);
    out('per-token').replaceChildren(bytesNode(exact.perTokenBytes));
    out('per-seq').replaceChildren(bytesNode(exact.sequenceBytes));
    out('total').replaceChildren(bytesNode(exact.totalBytes));
    out('per-gpu').replaceChildren(...(storage.tp > 1 ? [bytesNode(exact.perGpuTotalBytes), ` on each of ${storage.tp} GPUs`] : ['one GPU: the same as all sequences']));
    renderGroupTable(out('groups-table'), model.groups, exact);
    renderNaive(out('naive'), { naive: model.naive, naiveBytes: naive, exact, groups: model.groups, storage });
    renderKeys(out('config-keys'), model.read, entry);
    out('config-keys').dataset.provenance = kind;
    const growth = exact.perTokenBytes / storage.tp;
    renderTiles(out('tiles'), out('tiles-caption'), { ctx: state.ctx, seq: state.seq, block: state.block, bytesPerToken: growth });
    renderAllocation(out('alloc'), out('alloc-table'), { mix: state.mix, block: state.block, ctx: state.ctx, bytesPerToken: growth });
    out('alloc-note').textContent = model.groups.some((g) => g.kind !== 'full') || storage.tp > 1
      ? `This comparison counts ${formatBytes(growth)} for every position (all layers as if they kept it, one GPU); windows, states and sharing are in the totals above.` : '';
    renderFit({ weights: out('weights'), membar: out('membar'), membarLegend: out('membar-legend'), fit: out('fit') }, {
      params: state.params, weightBytesPerElement: bytesOf(state.wdtype), measuredWeights: measuredWeights(), memGiB: state.mem,
      groups: model.groups, storage, exact, ctx: state.ctx, seq: state.seq, contextWindow, maxTokens: LIMITS.ctx[1],
    });
  }

  render();
  out('loading').hidden = true;
  for (const name of ['body', 'alloc-part', 'fit-part', 'live-part']) out(name).hidden = false;
  root.dataset.ready = 'true';
}

function fillSelects(root, field, elementTypes, presets, catalogue) {
  for (const select of root.querySelectorAll('[data-element-select]')) {
    select.replaceChildren(...elementTypes.map((e) => new Option(`${e.label} (${e.bytes} B)`, e.id)));
  }
  field('sdtype').replaceChildren(...elementTypes.filter((e) => STATE_TYPES.includes(e.id)).map((e) => new Option(`${e.label} (${e.bytes} B)`, e.id)));
  field('block').replaceChildren(...BLOCK_SIZES.map((b) => new Option(plural(b, 'token'), String(b))));
  field('round').replaceChildren(...BLOCK_SIZES.map((b) => new Option(b === 1 ? 'none' : plural(b, 'position'), String(b))));
  field('tp').replaceChildren(...TP_SIZES.map((n) => new Option(plural(n, 'GPU'), String(n))));
  field('groupSize').replaceChildren(...GROUP_SIZES.map((n) => new Option(`G = ${n}`, String(n))));
  field('scaleBytes').replaceChildren(...SCALE_BYTES.map((n) => new Option(`${n} B (${n === 2 ? 'fp16' : 'fp32'})`, String(n))));
  const live = new Option('Live model (waiting for the server)', 'live');
  live.disabled = true;
  const configs = html('optgroup');
  configs.label = 'Bundled config.json files';
  configs.append(...catalogue.map((m) => new Option(m.label, `cfg:${m.id}`)));
  const pasted = new Option('Pasted config.json', 'pasted');
  field('preset').replaceChildren(...presets.map((p) => new Option(p.label, p.id)), configs, live, pasted, new Option('Custom', 'custom'));
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
  for (const name of ['dtype', 'wdtype', 'sdtype', 'scale']) figure.listen(field(name), 'change', (ev) => update({ [name]: ev.target.value }));
  for (const name of ['block', 'round', 'tp', 'groupSize', 'scaleBytes']) {
    figure.listen(field(name), 'change', (ev) => update({ [name]: Number(ev.target.value) }));
  }
}

function fieldText(name, state) {
  if (name === 'params') return billions(state.params);
  if (name === 'mix') return state.mix.join(', ');
  return state[name] == null ? '' : String(state[name]);
}

function showField(input, name, state) {
  input.value = fieldText(name, state);
}

const SHOWN = ['layers', 'heads', 'kvHeads', 'headDim', 'ctx', 'seq', 'params', 'mem', 'mix', 'dtype', 'wdtype', 'block', 'preset',
  'sdtype', 'scale', 'round', 'tp', 'groupSize', 'scaleBytes'];

// Puts the state into every control, except the one being typed in (rewriting it would fight the
// user: "8." is a valid 8 on its way to 8.03).
function showValues(field, state, sliders) {
  for (const name of SHOWN) {
    const input = field(name);
    if (input !== document.activeElement) showField(input, name, state);
  }
  sliders.ctx.set(state.ctx);
  sliders.seq.set(state.seq);
}

function renderKind(el, { heads, kvHeads }, model) {
  if (model.read) {
    const kinds = [...new Set(model.groups.map((g) => g.kind))];
    el.textContent = `Read from the config: ${plural(model.groups.length, 'layer group')} (${kinds.join(', ')}); `
      + 'the number fields show the one-formula reading of it, and editing them turns the model into one group of full attention.';
    return;
  }
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

function presetKind(preset, entry, read) {
  if (entry) return 'cited';
  if (read) return 'hypothetical'; // a pasted file: the reader's own numbers
  if (!preset) return 'hypothetical';
  if (preset.id === 'live') return 'measured';
  return preset.hypothetical ? 'hypothetical' : 'cited';
}

function sourceLine(kind, name, url, note) {
  const source = html('p', { cls: 'kvc-card-source' });
  source.dataset.provenance = kind;
  source.append(html('span', { cls: `tag tag-${kind}`, text: kind }), ' Source: ');
  if (url) {
    const a = html('a', { text: name });
    a.href = url;
    source.append(a);
  } else source.append(name);
  source.append(note ? `. ${note}` : '.');
  return source;
}

function renderConfigCard(el, entry, read) {
  const kind = presetKind(null, entry, read);
  const card = html('p', { cls: 'kvc-card-numbers', text: `${plural(read.naive.layers, 'layer')} read as ${read.groups.map((g) => `${formatInt(g.layers)} ${g.kind}`).join(' + ')}` });
  card.dataset.provenance = kind;
  const params = entry && entry.params ? ` Parameters: ${formatInt(entry.params)} (${entry.params_source}).` : '';
  const source = entry
    ? sourceLine(kind, `${entry.repo} config.json`, entry.url, `${entry.note ? `${entry.note} ` : ''}${params}`.trim())
    : sourceLine(kind, 'the config.json pasted here', null, 'Your file: its numbers are as you gave them');
  el.replaceChildren(card, source);
}

function renderPresetCard(el, preset, elementTypes, entry, read) {
  if (read) {
    renderConfigCard(el, entry, read);
    return;
  }
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
  // Where the card's numbers come from: read off the live model, a hypothetical worked example, or a cited config.
  const kind = presetKind(preset);
  const card = html('p', { cls: 'kvc-card-numbers', text: `${numbers.join(' · ')} → ${formatBytes(preset.bytes_per_token)} per token` });
  card.dataset.provenance = kind;
  el.replaceChildren(card, sourceLine(kind, preset.source.name, preset.source.url, preset.note));
}

// The live model as a preset: its cache type for the cache, and for the weights the type and the bytes the
// running route holds (ModelFacts.weights_dtype, weights_bytes, quantization), never the cache's type.
function presetFromFacts(f, elementTypes) {
  const type = elementTypes.find((e) => e.bytes === f.bytes_per_element) || elementTypes[0];
  const weightsType = WEIGHT_TYPES[f.weights_dtype] || type.id;
  const quant = f.quantization && f.quantization !== 'none' ? `; ${f.quantization}` : '';
  return {
    id: 'live', label: `Live model: ${f.name} (${f.weights_dtype || f.dtype} weights, ${f.dtype} cache)`, layers: f.layers,
    attention_heads: f.attention_heads, kv_heads: f.kv_heads, head_dim: f.head_dim, dtype: type.id, wdtype: weightsType,
    params: f.params, context_window: f.context_window, bytes_per_token: f.kv_bytes_per_token, weights_bytes: f.weights_bytes,
    weightsLabel: `${f.weights_dtype || f.dtype} weights, ModelFacts.weights_bytes`,
    source: { name: `the model running behind this page, as it reports itself (/api/model), on ${f.device_name || f.device}`, url: null },
    note: `Weights: ${f.weights_dtype || f.dtype}${quant}. KV cache: ${f.kv_dtype || f.dtype}`,
  };
}
