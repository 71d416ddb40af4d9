// Stage 6 figure: speculative decoding step by step for each case (proposed tokens coloured accepted
// or rejected, then the model's own token), with acceptance rate and measured speed-up. Token text
// is model output: it goes in through textContent only.
import { html } from '../shared/dom.js';
import { formatFixed, formatInt, formatMs } from '../shared/format.js';
import { clear, readouts, value } from './view.js';
import { specChips, visibleToken } from './math.js';

const KIND_TITLE = { rewrite: 'Rewriting a given passage', open: 'An open-ended request' };

function steps(parent, c) {
  const ol = html('ol', { cls: 'sv-spec-steps', parent });
  ol.setAttribute('aria-label', `${KIND_TITLE[c.kind] || c.kind}: proposals per step`);
  c.steps.forEach((step, i) => {
    const li = html('li', { parent: ol });
    // The first step is the prefill: nothing to check yet, it yields the first token.
    if (i === 0 && !(step.proposed || []).length) li.classList.add('is-prefill');
    for (const chip of specChips(step)) {
      const span = html('span', { cls: `sv-chip is-${chip.kind}`, text: visibleToken(chip.text), parent: li });
      span.dataset.kind = chip.kind;
      span.dataset.token = chip.text;
      span.dataset.provenance = 'measured'; // model output from the run shown
      span.title = chip.kind;
    }
  });
}

function caseBox(parent, c, method) {
  const box = html('div', { cls: 'sv-col sv-spec-case', parent });
  box.dataset.kind = c.kind;
  html('p', { cls: 'sv-sub', text: KIND_TITLE[c.kind] || c.kind, parent: box });
  const prompt = html('p', { cls: 'sv-prompt', parent: box });
  html('span', { cls: 'sv-prompt-label', text: 'Prompt: ', parent: prompt });
  html('q', { text: c.prompt, parent: prompt }).dataset.setting = '';
  steps(box, c);
  readouts(box, [
    ['accepted', `${formatInt(c.accepted)} of ${formatInt(c.proposed)} proposed`, 'measured', 'accepted'],
    ['acceptance rate', `${formatFixed(c.acceptance_rate * 100, 0)} %`, 'measured', 'rate'],
    ['plain / speculative', `${formatMs(c.plain_ms)} / ${formatMs(c.spec_ms)}`, 'measured', 'times'],
    ['speed-up', `×${formatFixed(c.speedup, 2)}`, 'measured', 'speedup'],
    ['same text as plain decoding', c.identical ? 'yes' : 'no', 'measured', 'identical'],
  ]);
  box.dataset.method = method;
}

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const r = response.result;
      const legend = html('p', { cls: 'sv-note', parent: el });
      legend.append('Proposer: ');
      value(legend, r.method, 'measured');
      legend.append('. ');
      for (const [k, t] of [['accepted', 'accepted'], ['rejected', 'rejected'], ['bonus', 'the model’s own token']]) {
        html('span', { cls: `sv-chip is-${k}`, text: t, parent: legend });
        legend.append(' ');
      }
      const pair = html('div', { cls: 'sv-pair', parent: el });
      for (const c of r.cases) caseBox(pair, c, r.method);
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
