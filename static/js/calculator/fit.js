// Weights beside the cache, and the reverse solve: how many sequences of the chosen length fit in
// the memory size, and how many positions each of the chosen number of sequences can have.
import { GIB, maxSequences, maxTokens, weightsBytes } from './kv-math.js';
import { html, svgEl } from '../shared/dom.js';
import { binary, formatInt, plural } from '../shared/format.js';
import { bytesNode } from './bytes.js';
import { memoryBar } from './layout.js';

export function renderFit(out, { params, weightBytesPerElement, memGiB, bytesPerToken, ctx, seq, contextWindow }) {
  const memory = Math.round(memGiB * GIB);
  const weights = params == null ? 0 : weightsBytes(params, weightBytesPerElement);
  const cache = bytesPerToken * ctx * seq;

  out.weights.replaceChildren(...(params == null
    ? ['No parameter count given, so the weights are not counted here.']
    : [`Weights: ${formatInt(params)} parameters × ${weightBytesPerElement} B = `, bytesNode(weights), '.']));

  drawBar(out.membar, out.membarLegend, memoryBar(memory, weights, cache), { memory, weights, cache });

  const seqs = maxSequences(memory, weights, bytesPerToken, ctx);
  const tokens = maxTokens(memory, weights, bytesPerToken, seq);
  const items = [];
  if (weights >= memory) {
    items.push(html('li', { text: `The weights alone (${binary(weights).text}) fill the ${binary(memory).text}: no cache fits.` }));
  } else {
    items.push(answer(`At ${plural(ctx, 'token')} per sequence: `, 'fit-seqs', plural(seqs, 'sequence'), ' fit.'));
    const beyond = contextWindow && tokens > contextWindow
      ? ` That is beyond this model's context window of ${formatInt(contextWindow)}, so the window, not memory, is the limit.` : '';
    items.push(answer(`With ${plural(seq, 'sequence')}: up to `, 'fit-tokens', plural(tokens, 'token'), ` each.${beyond}`));
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
