// The layer-by-layer read-outs: one formula line per layer group, the group table, the one-formula answer
// beside the exact one (with the ratio and why they differ), and where each number came from (the config
// keys, or the defaults a named config class supplies). Pure rendering of kv-layers.js results.
import { html, labelCells } from '../shared/dom.js';
import { formatBytes, formatInt, plural } from '../shared/format.js';
import { bytesNode } from './bytes.js';
import { ELEMENT_BITS, kvHeadsPerGpu, stateElements } from './kv-layers.js';

const KIND_LABEL = {
  full: 'full-attention', sliding: 'sliding-window', chunked: 'chunked-local', mla: 'MLA',
  state: 'linear-attention / state-space', shared: 'KV-shared', cross: 'cross-attention',
};

function scaleText(storage, vectors, width) {
  const zero = storage.zero_point ? ' × 2 (scale and zero point)' : '';
  if (storage.scale === 'head') return ` + ${vectors} scales × ${storage.scale_bytes} B${zero}`;
  if (storage.scale === 'group') {
    return ` + ${vectors} × ${formatInt(Math.ceil(width / storage.group_size))} scales (groups of ${storage.group_size}) × ${storage.scale_bytes} B${zero}`;
  }
  return '';
}

function heldText(g, part, tokens) {
  const t = formatInt(tokens);
  if (g.kind === 'cross') {
    const images = part.positionsHeld / g.per_image;
    return `${plural(images, 'image')} × ${formatInt(g.per_image)} positions each, whatever the text's length = ${plural(part.positionsHeld, 'position')}`;
  }
  const held = {
    sliding: `min(${t}, W ${formatInt(g.window)}: ${formatInt(g.window - 1)} past + the new one)`, chunked: `min(${t}, C ${formatInt(g.chunk)})`,
  }[g.kind];
  const base = held ? `${held} = ${plural(part.positionsHeld, 'position')}` : plural(part.positionsHeld, 'position');
  return part.positionsAllocated === part.positionsHeld ? base : `${base}, ${formatInt(part.positionsAllocated)} in whole blocks`;
}

// One sentence per group: its bytes per position per layer, the positions it keeps, its bytes per sequence.
export function groupLine(g, part, storage, tokens) {
  const bytes = ELEMENT_BITS[storage.kv_dtype] / 8;
  const n = `${formatInt(g.layers)} ${KIND_LABEL[g.kind]} layer${g.layers === 1 ? '' : 's'}`;
  const total = `→ ${formatBytes(part.sequenceBytes)} per sequence`;
  if (g.kind === 'shared') return `${n}: reuse another layer's keys and values, allocate nothing ${total}`;
  if (g.kind === 'state') {
    const gpu = storage.tp > 1 ? ` ÷ ${storage.tp} GPUs` : '';
    const conv = stateElements(g, storage) - g.state;
    // Both engines' conv state side by side: the chosen one counts, the other is said.
    const other = stateElements(g, { ...storage, conv_columns: storage.conv_columns === 'vllm' ? 'transformers' : 'vllm' }) - g.state;
    const columns = g.conv_kernel
      ? ` (${storage.conv_columns === 'vllm' ? `vLLM's ${g.conv_kernel - 1}` : `transformers' ${g.conv_kernel}`} columns; `
        + `${storage.conv_columns === 'vllm' ? `transformers' ${g.conv_kernel}` : `vLLM's ${g.conv_kernel - 1}`}: ${formatInt(other)})` : '';
    const elements = 'recurrent_bytes' in g
      ? `${formatInt(conv)} conv${columns} elements${gpu} × ${storage.state_bytes} B + ${formatInt(g.state)} recurrent${gpu} × ${g.recurrent_bytes} B (kept in float32)`
      : `(${formatInt(conv)} conv${columns} + ${formatInt(g.state)} recurrent) elements${gpu} × ${storage.state_bytes} B`;
    return `${n}: ${elements}, a fixed state whatever the length ${total}`;
  }
  let perLayer;
  if (g.kind === 'mla') {
    const width = g.latent + g.rope_dim;
    perLayer = `(${formatInt(g.latent)} latent + ${formatInt(g.rope_dim)} RoPE) × ${bytes} B${scaleText(storage, 1, width)}`;
  } else {
    const heads = kvHeadsPerGpu(g.kv_heads, storage.tp);
    const gpu = storage.tp > 1 ? ` (of ${formatInt(g.kv_heads)}, on each of ${storage.tp} GPUs)` : '';
    perLayer = `2 (K and V) × ${formatInt(heads)} KV heads${gpu} × ${formatInt(g.head_dim)} head dim × ${bytes} B`
      + `${scaleText(storage, 2 * heads, g.head_dim)}`;
  }
  const shared = g.kind === 'mla' ? ' (one vector shared by all heads: no factor 2)' : '';
  return `${n}: ${perLayer} = ${formatBytes(part.layerTokenBytes)} per position per layer${shared}; keeps ${heldText(g, part, tokens)} ${total}`;
}

export function renderFormula(el, groups, exact, storage, state) {
  const lines = groups.map((g, i) => groupLine(g, exact.groups[i], storage, state.ctx));
  const keeping = exact.groups.filter((p) => p.layerTokenBytes && p.kind !== 'cross');
  if (keeping.length) {
    const sum = keeping.map((p) => `${formatInt(p.layers)} × ${formatBytes(p.layerTokenBytes)}`).join(' + ');
    const gpuNote = storage.tp > 1 ? ` × ${storage.tp} GPUs` : '';
    lines.push(`One position in every layer that keeps it: ${sum}${gpuNote} = ${formatBytes(exact.perTokenBytes)} per token`);
  }
  if (exact.perImageBytes) {
    lines.push(`Apart from the per-token figure, each image adds ${formatBytes(exact.perImageBytes)} per sequence (the cross-attention `
      + `layers' keys and values of its positions), × ${plural(storage.images, 'image')} per request`);
  }
  const gpus = storage.tp > 1 ? ` on each GPU × ${storage.tp} GPUs` : '';
  const fixed = exact.fixedBytes ? ` + ${formatBytes(exact.fixedBytes)} of per-tensor scales` : '';
  lines.push(`${formatBytes(exact.perGpuSequenceBytes)} per sequence${gpus} × ${plural(state.seq, 'sequence')}${fixed} = ${formatBytes(exact.totalBytes)}`);
  el.replaceChildren(...lines.map((text) => html('span', { cls: 'kvc-formula-line', text })));
}

// One row per group; the byte columns are per GPU, and with tensor parallelism a last column gives all GPUs.
export function renderGroupTable(table, groups, exact) {
  const tp = exact.tp;
  const head = table.tHead.rows[0];
  head.cells[2].textContent = tp > 1 ? 'Per position, per layer, per GPU' : 'Per position, per layer';
  head.cells[4].textContent = tp > 1 ? 'Per sequence, per GPU' : 'Per sequence';
  head.cells[5].hidden = tp === 1;
  head.cells[5].textContent = `Per sequence, all ${tp} GPUs`;
  for (const [i, cell] of [...head.cells].entries()) cell.dataset.label = cell.textContent.trim() || String(i);
  table.tBodies[0].replaceChildren(...groups.map((g, i) => {
    const p = exact.groups[i];
    const tr = html('tr');
    const th = html('th', { text: KIND_LABEL[g.kind] });
    th.scope = 'row';
    const perPos = html('td');
    perPos.append(g.kind === 'state' || g.kind === 'shared' ? '–' : bytesNode(p.layerTokenBytes));
    const perSeq = html('td');
    perSeq.append(bytesNode(p.sequenceBytes));
    const allGpus = html('td');
    allGpus.append(bytesNode(p.sequenceBytes * tp));
    allGpus.hidden = tp === 1;
    const kept = g.kind === 'state' ? 'fixed state' : g.kind === 'shared' ? 'none (reused)'
      : g.kind === 'cross' ? `${formatInt(p.positionsAllocated)} (images)` : formatInt(p.positionsAllocated);
    tr.append(th, html('td', { text: formatInt(g.layers) }), perPos, html('td', { text: kept }), perSeq, allGpus);
    tr.dataset.kind = g.kind;
    return labelCells(table, tr);
  }));
}

const WHY = {
  mla: 'MLA layers cache one compressed latent and a RoPE key per position instead of a key and a value per head',
  sliding: 'sliding-window layers stop growing at their window',
  chunked: 'chunked-local layers keep at most one chunk',
  state: 'linear-attention / state-space layers keep a fixed state per sequence instead of keys and values per position',
  shared: 'KV-shared layers reuse another layer\'s cache',
  cross: 'cross-attention layers keep the images\' positions, not the text\'s',
};

// Why the one formula and the exact count differ, in one sentence built from what this model has.
export function whyTheyDiffer(groups, storage, exact, naive, shape = null) {
  const reasons = [...new Set(groups.map((g) => g.kind))].filter((k) => k in WHY).map((k) => WHY[k]);
  if (paddedValue(shape, groups)) {
    reasons.push(`each value is kept ${formatInt(shape.key_dim)} wide like its key, vLLM padding V from v_head_dim ${formatInt(shape.value_dim)} `
      + `to qk_nope + qk_rope (models/minicpm3.py), where the one formula counts it ${formatInt(shape.value_dim)} wide`);
  }
  if (new Set(groups.filter((g) => 'kv_heads' in g).map((g) => g.kv_heads)).size > 1) reasons.push('layers differ in their KV heads');
  if (storage.scale !== 'none') reasons.push(`the quantisation scales${storage.zero_point ? ' and zero points' : ''} take bytes of their own`);
  if (exact.groups.some((p) => p.positionsAllocated !== p.positionsHeld)) reasons.push(`each layer group holds whole blocks of ${storage.block_size}`);
  if (storage.tp > 1 && groups.some((g) => g.kind === 'mla' || (g.kv_heads && g.kv_heads < storage.tp))) {
    reasons.push(`${storage.tp} GPUs each hold a copy of what cannot be split`);
  }
  if (naive === exact.totalBytes) {
    return reasons.length ? `The two agree at this length, though ${reasons.join('; ')}.`
      : 'Every layer is full attention with the same KV heads, so the two agree.';
  }
  if (!reasons.length) return 'The one formula reads other head numbers than the layers use.';
  return `They differ because ${reasons.join('; ')}.`;
}

// An MLA-keyed file whose layers cache full heads (MiniCPM3 in vLLM): the values there are padded to the key's width.
function paddedValue(shape, groups) {
  return Boolean(shape && 'key_dim' in shape && shape.value_dim < shape.key_dim && !groups.some((g) => g.kind === 'mla'));
}

function naiveText(naive, storage, groups) {
  const bytes = ELEMENT_BITS[storage.kv_dtype] / 8;
  if (paddedValue(naive, groups)) {
    return `Every head's key and its value at v_head_dim, unpadded, ${formatInt(naive.layers)} layers × `
      + `${formatInt(naive.kv_heads)} heads × (${formatInt(naive.key_dim)} key + ${formatInt(naive.value_dim)} value) × ${bytes} B per position: `;
  }
  if ('key_dim' in naive) {
    return `Without MLA's compression (every head's key and value kept), ${formatInt(naive.layers)} layers × `
      + `${formatInt(naive.kv_heads)} heads × (${formatInt(naive.key_dim)} key + ${formatInt(naive.value_dim)} value) × ${bytes} B per position: `;
  }
  return `One formula, 2 × ${formatInt(naive.layers)} layers × ${formatInt(naive.kv_heads)} KV heads × `
    + `${formatInt(naive.head_dim)} head dim × ${bytes} B per position: `;
}

export function renderNaive(el, { naive, naiveBytes, exact, groups, storage }) {
  if (!naive || naiveBytes === null) {
    const text = !naive ? 'No one-formula reading: the config gives no uncompressed key and value size to compare with.'
      : 'The one formula passes 2^53 bytes here, beyond exact arithmetic.';
    el.replaceChildren(html('p', { text }));
    return;
  }
  const ratio = exact.totalBytes ? naiveBytes / exact.totalBytes : null;
  const one = html('p');
  one.append(naiveText(naive, storage, groups));
  const naiveOut = html('strong');
  naiveOut.dataset.out = 'naive-bytes';
  naiveOut.append(bytesNode(naiveBytes));
  one.append(naiveOut, '. Layer by layer: ');
  const exactOut = html('strong');
  exactOut.dataset.out = 'exact-bytes';
  exactOut.append(bytesNode(exact.totalBytes));
  one.append(exactOut, '. One formula ÷ exact = ');
  const ratioOut = html('strong', { text: ratio === null ? '–' : `${ratio.toFixed(2)}×` });
  ratioOut.dataset.out = 'naive-ratio';
  const why = html('p', { text: whyTheyDiffer(groups, storage, exact, naiveBytes, naive) });
  why.dataset.out = 'naive-why';
  one.append(ratioOut, '.');
  el.replaceChildren(one, why);
}

// Every value the reader used, with its key, or the named default it took when the file left the key out.
export function renderKeys(el, read, entry) {
  if (!read) {
    el.replaceChildren(html('li', { text: 'The numbers typed above (or the chosen preset): one group of full attention.' }));
    return;
  }
  const flagged = read.flags.map((f) => {
    const li = html('li', { cls: 'kvc-flagged' });
    li.append(html('strong', { text: 'Flagged: ' }), html('code', { text: f.field }), ` ${f.message}`);
    return li;
  });
  const items = read.used.map((u) => {
    const li = html('li');
    li.append(html('code', { text: u.key }), ` → ${u.name}: ${typeof u.value === 'number' ? formatInt(u.value) : String(u.value)}`);
    if (u.default) li.append(html('em', { text: ` (not in the file: ${u.default})` }));
    // a bundled entry's key that no copy of its file confirmed (model-configs.json `unchecked`)
    if (entry?.unchecked?.includes(u.key)) li.append(html('em', { cls: 'kvc-unchecked', text: ' (unchecked)' }));
    return li;
  });
  if (entry) {
    const li = html('li');
    const a = html('a', { text: entry.url });
    a.href = entry.url;
    li.append('File: ', a, `; values read from ${entry.read_from}.`);
    items.unshift(li);
  }
  if (read.weights) items.push(html('li', { text: `${read.weights.key} → weights: ${read.weights.note}` }));
  el.replaceChildren(...flagged, ...items);
}

// "Each further token adds X": one more position in every layer still growing at this length, before block
// rounding (with blocks of B the next token takes nothing, or a whole block at once).
export function renderFurther(el, further, perToken, ctx, tp, block) {
  const gpus = tp > 1 ? `, over all ${tp} GPUs` : '';
  let why = ` (only the layers without a window or chunk grow past ${formatInt(ctx)}; one position in every layer is ${formatBytes(perToken)})`;
  if (further === perToken) why = ' (every layer that keeps positions still grows here)';
  if (further === 0) {
    el.replaceChildren('Each further token adds ', bytesNode(0), ' to each sequence: nothing grows past this length, every window, chunk and state is full.');
    return;
  }
  const blocks = block > 1
    ? ` In blocks of ${block} positions the cache takes nothing until the last block is full, then ${block} positions' worth at once.`
    : '';
  el.replaceChildren('Each further token adds ', bytesNode(further), ` to each sequence before block rounding${gpus}${why}.${blocks}`);
}
