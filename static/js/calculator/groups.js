// The layer-by-layer read-outs: one formula line per layer group, the group table, the one-formula answer
// beside the exact one (with the ratio and why they differ), and where each number came from (the config
// keys, or the defaults a named config class supplies). Pure rendering of kv-layers.js results.
import { html, labelCells } from '../shared/dom.js';
import { formatBytes, formatInt, plural } from '../shared/format.js';
import { bytesNode } from './bytes.js';
import { ELEMENT_BITS, kvHeadsPerGpu } from './kv-layers.js';

const KIND_LABEL = {
  full: 'full-attention', sliding: 'sliding-window', chunked: 'chunked-local', mla: 'MLA',
  state: 'linear-attention / state-space', shared: 'KV-shared',
};

function scaleText(storage, vectors, width) {
  if (storage.scale === 'head') return ` + ${vectors} scales × ${storage.scale_bytes} B`;
  if (storage.scale === 'group') {
    return ` + ${vectors} × ${formatInt(Math.ceil(width / storage.group_size))} scales (groups of ${storage.group_size}) × ${storage.scale_bytes} B`;
  }
  return '';
}

function heldText(g, part, tokens) {
  const t = formatInt(tokens);
  const held = { sliding: `min(${t}, W ${formatInt(g.window)})`, chunked: `min(${t}, C ${formatInt(g.chunk)})` }[g.kind];
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
    return `${n}: (${formatInt(g.conv)} conv + ${formatInt(g.state)} recurrent) elements${gpu} × ${storage.state_bytes} B, `
      + `a fixed state whatever the length ${total}`;
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
  const keeping = exact.groups.filter((p) => p.layerTokenBytes);
  if (keeping.length) {
    const sum = keeping.map((p) => `${formatInt(p.layers)} × ${formatBytes(p.layerTokenBytes)}`).join(' + ');
    const gpuNote = storage.tp > 1 ? ` × ${storage.tp} GPUs` : '';
    lines.push(`One position in every layer that keeps it: ${sum}${gpuNote} = ${formatBytes(exact.perTokenBytes)} per token`);
  }
  const gpus = storage.tp > 1 ? ` on each GPU × ${storage.tp} GPUs` : '';
  const fixed = exact.fixedBytes ? ` + ${formatBytes(exact.fixedBytes)} of per-tensor scales` : '';
  lines.push(`${formatBytes(exact.perGpuSequenceBytes)} per sequence${gpus} × ${plural(state.seq, 'sequence')}${fixed} = ${formatBytes(exact.totalBytes)}`);
  el.replaceChildren(...lines.map((text) => html('span', { cls: 'kvc-formula-line', text })));
}

export function renderGroupTable(table, groups, exact) {
  table.tBodies[0].replaceChildren(...groups.map((g, i) => {
    const p = exact.groups[i];
    const tr = html('tr');
    const th = html('th', { text: KIND_LABEL[g.kind] });
    th.scope = 'row';
    const perPos = html('td');
    perPos.append(g.kind === 'state' || g.kind === 'shared' ? '–' : bytesNode(p.layerTokenBytes));
    const perSeq = html('td');
    perSeq.append(bytesNode(p.sequenceBytes));
    const kept = g.kind === 'state' ? 'fixed state' : g.kind === 'shared' ? 'none (reused)' : formatInt(p.positionsAllocated);
    tr.append(th, html('td', { text: formatInt(g.layers) }), perPos, html('td', { text: kept }), perSeq);
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
};

// Why the one formula and the exact count differ, in one sentence built from what this model has.
export function whyTheyDiffer(groups, storage, exact, naive) {
  const reasons = [...new Set(groups.map((g) => g.kind))].filter((k) => k in WHY).map((k) => WHY[k]);
  if (new Set(groups.filter((g) => 'kv_heads' in g).map((g) => g.kv_heads)).size > 1) reasons.push('layers differ in their KV heads');
  if (storage.scale !== 'none') reasons.push('the quantisation scales take bytes of their own');
  if (storage.block_size > 1) reasons.push(`each layer group holds whole blocks of ${storage.block_size}`);
  if (storage.tp > 1 && groups.some((g) => g.kind === 'mla' || (g.kv_heads && g.kv_heads < storage.tp))) {
    reasons.push(`${storage.tp} GPUs each hold a copy of what cannot be split`);
  }
  if (!reasons.length) {
    return naive === exact.totalBytes ? 'Every layer is full attention with the same KV heads, so the two agree.'
      : 'The one formula reads other head numbers than the layers use.';
  }
  return `They differ because ${reasons.join('; ')}.`;
}

export function renderNaive(el, { naive, naiveBytes, exact, groups, storage }) {
  const ratio = exact.totalBytes ? naiveBytes / exact.totalBytes : null;
  const one = html('p');
  one.append(`One formula, 2 × ${formatInt(naive.layers)} layers × ${formatInt(naive.kv_heads)} KV heads × `
    + `${formatInt(naive.head_dim)} head dim × ${ELEMENT_BITS[storage.kv_dtype] / 8} B per position: `);
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
  const why = html('p', { text: whyTheyDiffer(groups, storage, exact, naiveBytes) });
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
  el.replaceChildren(...items);
}
