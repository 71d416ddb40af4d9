// The model's card and the attention-kind line: what the chosen preset, bundled or pasted config or live model is,
// where its numbers come from (read from a config, measured from the running model, cited, or hypothetical), and
// the live model turned into a preset. Pure rendering; index.js decides when.
import { html } from '../shared/dom.js';
import { formatBytes, formatInt, plural } from '../shared/format.js';
import { attentionKind } from './kv-math.js';

const WEIGHT_TYPES = { float32: 'fp32', bfloat16: 'fp16', float16: 'fp16', int8: 'int8', int4: 'int4' };

export function renderKind(el, { heads, kvHeads }, model) {
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

// A bundled or pasted config.json is a cited file: its numbers are read from it, not made up.
export function presetKind(preset, entry, read) {
  if (entry || read) return 'cited';
  if (!preset) return 'hypothetical';
  if (preset.id === 'live') return 'measured';
  return preset.hypothetical ? 'hypothetical' : 'cited';
}

function sourceLine(kind, name, url, note, tagText = kind) {
  const source = html('p', { cls: 'kvc-card-source' });
  source.dataset.provenance = kind;
  source.append(html('span', { cls: `tag tag-${kind}`, text: tagText }), ' Source: ');
  if (url) {
    const a = html('a', { text: name });
    a.href = url;
    source.append(a);
  } else source.append(name);
  source.append(note ? `. ${note}` : '.');
  return source;
}

function renderConfigCard(el, entry, read) {
  const card = html('p', { cls: 'kvc-card-numbers', text: `${plural(read.naive ? read.naive.layers : read.groups.reduce((a, g) => a + g.layers, 0), 'layer')} read as ${read.groups.map((g) => `${formatInt(g.layers)} ${g.kind}`).join(' + ')}` });
  card.dataset.provenance = 'cited';
  const params = entry && entry.params ? ` Parameters: ${formatInt(entry.params)} (${entry.params_source}).` : '';
  const flagged = read.flags.length ? ` ${plural(read.flags.length, 'key')} flagged below, under “Where each number comes from”.` : '';
  const type = read.modelType ? `model_type ${read.modelType}` : 'no model_type';
  const source = entry
    ? sourceLine('cited', `${entry.repo} config.json`, entry.url, `${entry.note ? `${entry.note} ` : ''}${params}${flagged}`.trim(), 'read')
    : sourceLine('cited', `the config.json pasted here (${type})`, null, `Read key by key as the list below says.${flagged}`, 'read');
  el.replaceChildren(card, source);
}

export function renderPresetCard(el, preset, elementTypes, entry, read) {
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
export function presetFromFacts(f, elementTypes) {
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
