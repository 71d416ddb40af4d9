// The KV-memory calculator figure: mount(el) loads the presets and golden cases (static/data/kv_golden.json), the
// bundled model configs (static/data/model-configs.json) and the config key table (static/data/config-keys.json),
// binds the template's controls to one state object, computes each edit once with the layer-group arithmetic
// (kv-layers.js) and redraws every read-out from that one result, and mirrors the state into the query string;
// destroy() undoes all of that. A link, a paste or a typed value the arithmetic refuses leaves the last valid
// state shown, with a message naming the field and the limit.
import { currentModel } from '../model-status.js';
import { html } from '../shared/dom.js';
import { defineFigure } from '../shared/figure.js';
import { billions, formatBytes, formatInt, plural } from '../shared/format.js';
import { renderAllocation } from './allocation.js';
import { renderEngines } from './engines.js';
import { bytesNode } from './bytes.js';
import { presetFromFacts, presetKind, renderKind, renderPresetCard } from './cards.js';
import { bindConfigInput } from './config-input.js';
import { renderFit } from './fit.js';
import { renderFormula, renderFurther, renderGroupTable, renderKeys, renderNaive } from './groups.js';
import { GIB } from './kv-math.js';
import { KvInputError, cacheBytes, checkAttentionHeads, furtherTokenBytes, naiveBytes, vllmCapacity } from './kv-layers.js';
import { createLiveCheck } from './live-check.js';
import { resolveModel } from './model.js';
import { createSlider } from './slider.js';
import {
  BLOCK_SIZES, CONFIG_TEXT_MAX, CONV_COLUMNS, GROUP_SIZES, LABELS, LIMITS, SCALE_BYTES, TP_SIZES, defaults, fromConfig, fromPreset, parse,
  parseMix, readNumber, readWhole, urlKey, write,
} from './state.js';
import { renderTiles } from './tiles.js';
import { readConfig } from './kv-config.js';
import { renderVllm } from './vllm.js';

const DATA_URL = new URL('../../data/kv_golden.json', import.meta.url);
const CATALOGUE_URL = new URL('../../data/model-configs.json', import.meta.url);
const KEYS_URL = new URL('../../data/config-keys.json', import.meta.url);
const ARCH_FIELDS = ['layers', 'heads', 'kvHeads', 'headDim'];
const STATE_TYPES = ['fp32', 'fp16', 'fp8']; // whole bytes: a recurrent state is not kept in 4 bits
// Where the live model's weight type (ModelFacts.weights_dtype) lands among the element types.
// The state fields an arithmetic error can be traced to, most likely first (KvInputError.field → state keys).
const CULPRITS = {
  tp: ['tp'], tokens: ['ctx', 'seq'], sequences: ['seq'], kv_dtype: ['dtype'], block_size: ['block'],
  group_size: ['groupSize'], scale_bytes: ['scaleBytes'], state_bytes: ['sdtype'], scale: ['scale'], config: ['preset'],
  images: ['images'],
};

async function loadJson(url, signal) {
  const res = await fetch(url, { signal });
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  return res.json();
}

export const { mount, destroy } = defineFigure((root, figure) => {
  Promise.all([DATA_URL, CATALOGUE_URL, KEYS_URL].map((url) => loadJson(url, figure.signal)))
    .then(([golden, catalogue, table]) => { if (figure.alive) start(root, golden, catalogue.models, table, figure); })
    .catch((err) => {
      if (!figure.alive) return; // destroyed: the fetch was aborted on purpose
      root.querySelector('[data-out="loading"]').textContent = `The calculator could not load its data (${err.message}).`;
    });
});

function culprits(err) {
  if (err.field in CULPRITS) return CULPRITS[err.field];
  if (err.field.startsWith('groups')) return ['preset', 'layers', 'kvHeads', 'headDim'];
  return [];
}

// Everything here listens through `figure`, so destroy() removes it all.
function start(root, golden, catalogue, table, figure) {
  const field = (name) => root.querySelector(`[data-field="${name}"]`);
  const out = (name) => root.querySelector(`[data-out="${name}"]`);
  const elementTypes = golden.element_types;
  const bytesOf = (id) => elementTypes.find((e) => e.id === id).bytes;
  const presets = golden.presets;
  let livePreset = null;
  let liveApplied = false;

  fillSelects(root, field, elementTypes, presets, catalogue);

  function presetById(id) {
    return id === 'live' ? livePreset : presets.find((p) => p.id === id);
  }

  const storageOf = (st) => ({
    kv_dtype: st.dtype, scale: st.scale, group_size: st.groupSize, scale_bytes: st.scaleBytes, block_size: st.block,
    tp: st.tp, state_bytes: bytesOf(st.sdtype), zero_point: st.zp, conv_columns: st.conv, images: st.images,
  });

  // The whole answer for a state, computed once, or a KvInputError naming the field (the caller keeps the last
  // valid state).
  function compute(st) {
    const model = resolveModel(st, catalogue, table);
    if (model.rejected) {
      const e = model.rejected.errors[0];
      throw new KvInputError('config', `${e.field}: ${e.message}`);
    }
    const storage = storageOf(st);
    const exact = cacheBytes(model.groups, st.ctx, st.seq, storage);
    checkAttentionHeads(st.heads, storage.tp); // after the KV heads' check, whose message is the more telling one
    const naive = model.naive ? naiveBytes(model.naive, st.ctx, st.seq, st.dtype) : null;
    let vllm;
    try {
      vllm = vllmCapacity(model.groups, storage, Math.round(st.vspace * GIB), st.vlen);
    } catch (err) {
      if (!(err instanceof KvInputError)) throw err;
      vllm = { error: err };
    }
    return {
      st, model, storage, exact, naive: Number.isSafeInteger(naive) ? naive : null, vllm,
      further: furtherTokenBytes(model.groups, st.ctx, storage),
    };
  }

  // A linked state the arithmetic refuses: set aside the field the error points at (back to its default), say
  // so, and try again; at worst the defaults.
  function settle(st, problems) {
    const base = defaults(presets);
    let next = st;
    for (let tries = 0; tries < 12; tries += 1) {
      try {
        return { result: compute(next), problems };
      } catch (err) {
        if (!(err instanceof KvInputError)) throw err;
        const key = culprits(err).find((k) => JSON.stringify(next[k]) !== JSON.stringify(base[k]));
        if (!key) break;
        problems.push({ field: urlKey(key), message: err.reason });
        next = key === 'preset' ? { ...next, ...fromPreset(next, presets.find((p) => p.id === 'reference')) } : { ...next, [key]: base[key] };
      }
    }
    problems.push({ field: 'link', message: 'could not be computed; the defaults are shown' });
    return { result: compute(base), problems };
  }

  // A link that names a config but not its numbers (?preset=cfg:gemma-3-27b) shows the config's own: the number
  // fields, the weights' and the state's types; what the link states itself stays.
  function hydrate(res, search) {
    const { st, model } = res;
    if (!model.read) return res;
    const filled = fromConfig(st, st.preset, model.read, model.entry ? model.entry.params : st.params, st.config);
    for (const f of ['layers', 'heads', 'kvHeads', 'headDim', 'wdtype', 'sdtype', 'params']) {
      if (search.get(urlKey(f)) !== null) filled[f] = st[f];
    }
    return { ...res, st: filled };
  }

  const search = new URLSearchParams(location.search);
  const parsed = parse(search, presets, elementTypes.map((e) => e.id), catalogue.map((m) => m.id));
  const settled = settle(parsed.state, parsed.problems);
  let result = hydrate(settled.result, search);
  let state = result.st;

  function showError(err) {
    if (!err) {
      out('calc-error').textContent = '';
      return;
    }
    const label = culprits(err).map((k) => LABELS[k]).find(Boolean) || err.field;
    out('calc-error').textContent = `${label} (${err.field}): ${err.reason}. The last valid numbers stay shown.`;
  }

  function showLinkProblems(problems) {
    out('calc-error').textContent = problems.length
      ? `This link's ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}. Set aside: the rest of the link is shown.` : '';
  }

  // A user change: new state, computed once, every read-out redrawn from that one result, the URL updated for
  // sharing. Editing an architecture field by hand turns the preset into "custom" (one group of full attention).
  function update(patch) {
    let next = { ...state, ...patch };
    if (!('preset' in patch) && ARCH_FIELDS.some((f) => f in patch)) next = { ...next, preset: 'custom', config: null };
    let fresh;
    try {
      fresh = compute(next);
    } catch (err) {
      if (!(err instanceof KvInputError)) throw err;
      showError(err);
      render();
      return false;
    }
    state = next;
    result = fresh;
    showError(null);
    render();
    const url = new URL(location.href);
    write(url.searchParams, state);
    history.replaceState(history.state, '', url);
    return true;
  }

  const sliders = {
    ctx: createSlider(root.querySelector('[data-slider="ctx"]'), {
      min: LIMITS.ctx[0], max: LIMITS.ctx[1], valueText: (v) => plural(v, 'token'), onChange: (v) => update({ ctx: v }),
    }, figure),
    seq: createSlider(root.querySelector('[data-slider="seq"]'), {
      min: LIMITS.seq[0], max: LIMITS.seq[1], valueText: (v) => plural(v, 'sequence'), onChange: (v) => update({ seq: v }),
    }, figure),
  };

  bindInputs(field, out, update, () => state, figure);
  figure.listen(field('preset'), 'change', (ev) => {
    const id = ev.target.value;
    const entry = catalogue.find((m) => `cfg:${m.id}` === id);
    if (entry) {
      update(fromConfig(state, id, readConfig(entry.config, table), entry.params));
      return;
    }
    const preset = presetById(id);
    update(preset ? fromPreset(state, preset) : { preset: 'custom', config: null });
  });
  const configBox = bindConfigInput(root, figure, table, {
    onRead: (read, text) => {
      update(fromConfig(state, 'pasted', read, state.params, text));
      if (text.length > CONFIG_TEXT_MAX) {
        out('config-error').textContent = `config.json: its relevant keys take ${formatInt(text.length)} characters, more than the `
          + `${formatInt(CONFIG_TEXT_MAX)} a link carries: a shared link will not restore it.`;
      }
    },
    onError: (errors) => { out('config-error').textContent = errors.map((e) => `${e.field}: ${e.message}`).join(' · '); },
  });
  if (state.preset === 'pasted' && state.config) configBox.show(state.config); // a shared link restores the paste

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

  function measuredWeights() {
    if (state.preset !== 'live' || !livePreset || state.params !== livePreset.params) return null;
    return { bytes: livePreset.weights_bytes, label: livePreset.weightsLabel };
  }

  function render() {
    const { model, storage, exact, naive, further, vllm } = result;
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
    renderFurther(out('further'), further, exact.perTokenBytes, state.ctx, storage.tp, storage.block_size);
    renderGroupTable(out('groups-table'), model.groups, exact);
    renderNaive(out('naive'), { naive: model.naive, naiveBytes: naive, exact, groups: model.groups, storage });
    renderEngines(out('engines'), model.read && model.read.engines, storage, state.ctx);
    renderKeys(out('config-keys'), model.read, entry);
    out('config-keys').dataset.provenance = kind;
    renderTiles(out('tiles'), out('tiles-caption'), { ctx: state.ctx, seq: state.seq, block: state.block, parts: exact.groups, tp: storage.tp });
    const growth = exact.perTokenBytes / storage.tp;
    renderAllocation(out('alloc'), out('alloc-table'), { mix: state.mix, block: state.block, ctx: state.ctx, bytesPerToken: growth });
    out('alloc-note').textContent = `Blocks of ${plural(state.block, 'position')}, the block size chosen under “Storage and GPUs”. `
      + (model.groups.some((g) => g.kind !== 'full') || storage.tp > 1
        ? `This comparison counts ${formatBytes(growth)} for every position (all layers as if they kept it, one GPU); windows, states and sharing are in the totals above.` : '');
    renderFit({ weights: out('weights'), membar: out('membar'), membarLegend: out('membar-legend'), fit: out('fit') }, {
      params: state.params, weightBytesPerElement: bytesOf(state.wdtype), measuredWeights: measuredWeights(), memGiB: state.mem,
      groups: model.groups, storage, exact, ctx: state.ctx, seq: state.seq, contextWindow, maxTokens: LIMITS.ctx[1],
    });
    renderVllm({ line: out('vllm-line'), worked: out('vllm-worked') }, vllm, { block: state.block, vlen: state.vlen, vspace: state.vspace });
  }

  render();
  showLinkProblems(settled.problems);
  if (settled.problems.length) {
    const url = new URL(location.href); // the link's refused values are not kept in the address either
    write(url.searchParams, state);
    history.replaceState(history.state, '', url);
  }
  onModel(currentModel());
  out('loading').hidden = true;
  for (const name of ['body', 'alloc-part', 'fit-part', 'vllm-part', 'live-part']) out(name).hidden = false;
  root.dataset.ready = 'true';
}

function fillSelects(root, field, elementTypes, presets, catalogue) {
  for (const select of root.querySelectorAll('[data-element-select]')) {
    select.replaceChildren(...elementTypes.map((e) => new Option(`${e.label} (${e.bytes} B)`, e.id)));
  }
  field('sdtype').replaceChildren(...elementTypes.filter((e) => STATE_TYPES.includes(e.id)).map((e) => new Option(`${e.label} (${e.bytes} B)`, e.id)));
  field('block').replaceChildren(...BLOCK_SIZES.map((b) => new Option(b === 1 ? '1 (none)' : String(b), String(b))));
  field('tp').replaceChildren(...TP_SIZES.map((n) => new Option(plural(n, 'GPU'), String(n))));
  field('groupSize').replaceChildren(...GROUP_SIZES.map((n) => new Option(`G = ${n}`, String(n))));
  field('scaleBytes').replaceChildren(...SCALE_BYTES.map((n) => new Option(`${n} B (${n === 2 ? 'fp16' : 'fp32'})`, String(n))));
  const convText = { transformers: 'transformers: conv_kernel columns', vllm: 'vLLM: conv_kernel − 1 columns' };
  field('conv').replaceChildren(...CONV_COLUMNS.map((c) => new Option(convText[c], c)));
  const live = new Option('Live model (waiting for the server)', 'live');
  live.disabled = true;
  const configs = html('optgroup');
  configs.label = 'Bundled config.json files';
  configs.append(...catalogue.map((m) => new Option(m.label, `cfg:${m.id}`)));
  const pasted = new Option('Pasted config.json', 'pasted');
  field('preset').replaceChildren(...presets.map((p) => new Option(p.label, p.id)), configs, live, pasted, new Option('Custom', 'custom'));
}

// Where each typed field's refusal is said: beside the part of the page it belongs to.
const ERROR_OUT = { params: 'fit-error', mem: 'fit-error', vspace: 'vllm-error', vlen: 'vllm-error', mix: 'mix-error' };

// Number and text fields commit on change (leaving the field) or Enter, never per keystroke: "1e3" is 1,000,
// not a 1 on the way. What does not read is refused, marked, and the message names the field and its limit; the
// state keeps its last valid value until the field reads.
function bindInputs(field, out, update, getState, figure) {
  const whole = (name) => (t) => readWhole(t, LIMITS[name]);
  const parsers = {
    ctx: whole('ctx'), seq: whole('seq'), layers: whole('layers'), kvHeads: whole('kvHeads'), headDim: whole('headDim'),
    vlen: whole('vlen'), images: whole('images'),
    heads: (t) => (t.trim() === '' ? { value: null } : readWhole(t, LIMITS.heads)),
    params: (t) => {
      if (t.trim() === '') return { value: null };
      const b = readNumber(t, [0, LIMITS.params[1] / 1e9]);
      return 'value' in b ? { value: Math.round(b.value * 1e9) } : b;
    },
    mem: (t) => readNumber(t, LIMITS.mem), vspace: (t) => readNumber(t, LIMITS.vspace),
    mix: (t) => {
      const v = parseMix(t);
      return v ? { value: v } : { reason: `give 1 to ${LIMITS.mixCount[1]} whole numbers from 1 to ${formatInt(LIMITS.mixLen[1])}, separated by commas` };
    },
  };
  const say = (name, text) => { out(ERROR_OUT[name] || 'input-error').textContent = text; };

  for (const [name, read] of Object.entries(parsers)) {
    const input = field(name);
    const commit = () => {
      // A number field whose text the browser cannot read as a number (1e400) reports an empty value: refuse it.
      const got = input.validity && input.validity.badInput
        ? { reason: `${(read('?').reason || '').replace(/ \(got .*\)$/, '')}; what was typed is not a number it can read` }
        : read(input.value);
      if (!('value' in got)) {
        input.setAttribute('aria-invalid', 'true');
        say(name, `${LABELS[name]}: ${got.reason}. Not used: the last valid value stays in the figures.`);
        return;
      }
      input.setAttribute('aria-invalid', 'false');
      say(name, '');
      const current = getState()[name];
      if (JSON.stringify(current) !== JSON.stringify(got.value)) update({ [name]: got.value });
      input.value = fieldText(name, getState());
    };
    figure.listen(input, 'change', commit);
    figure.listen(input, 'keydown', (ev) => { if (ev.key === 'Enter') { ev.preventDefault(); commit(); } });
    figure.listen(input, 'input', () => {
      // Typing clears an earlier refusal once the text reads again; nothing is computed until it is committed.
      if (input.getAttribute('aria-invalid') === 'true' && 'value' in read(input.value)) {
        input.setAttribute('aria-invalid', 'false');
        say(name, '');
      }
    });
  }
  for (const name of ['dtype', 'wdtype', 'sdtype', 'scale', 'conv']) figure.listen(field(name), 'change', (ev) => update({ [name]: ev.target.value }));
  for (const name of ['block', 'tp', 'groupSize', 'scaleBytes']) {
    figure.listen(field(name), 'change', (ev) => update({ [name]: Number(ev.target.value) }));
  }
  figure.listen(field('zp'), 'change', (ev) => update({ zp: ev.target.checked }));
}

function fieldText(name, state) {
  if (name === 'params') return billions(state.params);
  if (name === 'mix') return state.mix.join(', ');
  return state[name] == null ? '' : String(state[name]);
}

const SHOWN = ['layers', 'heads', 'kvHeads', 'headDim', 'ctx', 'seq', 'params', 'mem', 'mix', 'dtype', 'wdtype', 'block', 'preset',
  'sdtype', 'scale', 'tp', 'groupSize', 'scaleBytes', 'conv', 'vspace', 'vlen', 'images'];

// Puts the state into every control, except the one being typed in (rewriting it would fight the user) and one
// holding a refused entry (its text stays beside its message until it reads).
function showValues(field, state, sliders) {
  for (const name of SHOWN) {
    const input = field(name);
    if (input !== document.activeElement && input.getAttribute('aria-invalid') !== 'true') input.value = fieldText(name, state);
  }
  field('zp').checked = state.zp;
  sliders.ctx.set(state.ctx);
  sliders.seq.set(state.seq);
}
