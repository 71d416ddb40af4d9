// Weights beside the cache, and the reverse solve on one GPU: how many sequences of the chosen length fit in
// the memory size, and how many positions each of the chosen number of sequences can have (kv-layers.js fit:
// weights ÷ TP, windows, per-sequence states and scales all counted).
import { GIB, weightsBytes } from './kv-math.js';
import { furtherTokenBytes, fit as solve } from './kv-layers.js';
import { html, svgEl } from '../shared/dom.js';
import { binary, formatInt, plural } from '../shared/format.js';
import { bytesNode } from './bytes.js';
import { memoryBar } from './layout.js';

// `weights`: {measured: bytes the running route holds, or null} beside params × element bytes.
export function renderFit(out, { params, weightBytesPerElement, measuredWeights, memGiB, groups, storage, exact, ctx, seq, contextWindow, maxTokens }) {
  const memory = Math.round(memGiB * GIB);
  let weights = 0;
  if (measuredWeights) {
    weights = measuredWeights.bytes;
    const tag = html('span', { cls: 'tag tag-measured', text: 'measured' });
    out.weights.dataset.provenance = 'measured';
    out.weights.replaceChildren('Weights as the running route holds them (', measuredWeights.label, '): ', bytesNode(weights), ' ', tag, '.');
  } else {
    weights = params == null ? 0 : weightsBytes(params, weightBytesPerElement);
    out.weights.dataset.provenance = 'computed';
    out.weights.replaceChildren(...(params == null
      ? ['No parameter count given, so the weights are not counted here.']
      : [`Weights: ${formatInt(params)} parameters × ${weightBytesPerElement} B = `, bytesNode(weights), '.']));
  }
  const plan = solve(groups, storage, { memory, weights, tokens: ctx, sequences: seq, maxTokens });
  if (storage.tp > 1) out.weights.append(` Split over ${storage.tp} GPUs: `, bytesNode(plan.weightsPerGpu), ' on each; the plan below is per GPU.');
  const cache = exact.perGpuTotalBytes;
  drawBar(out.membar, out.membarLegend, memoryBar(memory, plan.weightsPerGpu, cache), { memory, weights: plan.weightsPerGpu, cache });

  const items = [];
  if (plan.weightsPerGpu >= memory) {
    items.push(html('li', { text: `The weights alone (${binary(plan.weightsPerGpu).text}) fill the ${binary(memory).text}: no cache fits.` }));
  } else {
    const seqs = plan.sequences === null ? 'any number of sequences' : plural(plan.sequences, 'sequence');
    items.push(answer(`At ${plural(ctx, 'token')} per sequence: `, 'fit-seqs', seqs, ' fit.'));
    let capped = '';
    if (plan.tokens >= maxTokens) {
      capped = furtherTokenBytes(groups, maxTokens - 1, storage) === 0
        ? ` (the most this calculator tries: nothing here grows past its windows and states, so any length fits)`
        : ` (the most this calculator tries, ${formatInt(maxTokens)} tokens: more would still fit)`;
    }
    const beyond = contextWindow && plan.tokens > contextWindow
      ? ` That is beyond this model's context window of ${formatInt(contextWindow)}, so the window, not memory, is the limit.` : '';
    items.push(answer(`With ${plural(seq, 'sequence')}: up to `, 'fit-tokens', plural(plan.tokens, 'token'), ` each${capped}.${beyond}`));
  }
  out.fit.replaceChildren(...items);
}

function answer(before, name, value, after) {
  const li = html('li');
  const strong = html('strong', { text: value });
  strong.dataset.out = name;
  li.append(before, strong, after);
  return li;
}

function drawBar(svg, legend, bar, { memory, weights, cache }) {
  const W = 600;
  let x = 0;
  svg.replaceChildren();
  for (const [cls, f] of [['kvc-bar-weights', bar.weights], ['kvc-bar-cache', bar.cache], ['kvc-bar-free', bar.free]]) {
    svg.append(svgEl('rect', { class: cls, x: x * W, y: 4, width: f * W, height: 20 }));
    x += f;
  }
  if (bar.over) {
    svg.append(svgEl('rect', { class: 'kvc-bar-over', x: bar.memoryMark * W, y: 0, width: (1 - bar.memoryMark) * W, height: 28 }));
  }
  svg.append(svgEl('line', { class: 'kvc-bar-mark', x1: bar.memoryMark * W, x2: bar.memoryMark * W, y1: 0, y2: 28 }));
  const rest = bar.over
    ? [key('kvc-key-over'), ` ${binary(bar.over).text} more than the memory holds`]
    : [key('kvc-key-free'), ` free ${binary(memory - weights - cache).text}`];
  legend.replaceChildren(
    key('kvc-key-weights'), ` weights ${binary(weights).text} `,
    key('kvc-key-cache'), ` cache (all sequences) ${binary(cache).text} `,
    ...rest, ` — memory ${binary(memory).text}`,
  );
  svg.setAttribute('aria-label', legend.textContent);
}

function key(cls) {
  return html('span', { cls: `kvc-key ${cls}` });
}
