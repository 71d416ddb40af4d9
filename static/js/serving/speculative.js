// Stage 7 figure: speculative decoding step by step for each case (proposed tokens coloured accepted
// or rejected, then the model's own token), with acceptance rate and measured speed-up. Token text
// is model output: it goes in through textContent only.
import { html } from '../shared/dom.js';
import { formatFixed, formatInt, formatMs } from '../shared/format.js';
import { clear, readouts, setting, value } from './view.js';
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

// The average time of one forward pass in each run (the prefill included in both): how much a pass
// that checks several proposed tokens costs against a plain one-token step. null without the counts.
export function passCost(c) {
  if (!(c.forwards > 0 && c.plain_forwards > 0 && c.plain_ms > 0)) return null;
  const plain = c.plain_ms / c.plain_forwards;
  const spec = c.spec_ms / c.forwards;
  return { plain, spec, ratio: spec / plain };
}

// A fully accepted run of proposals still ends with the model's own token: the bonus, for free.
function fullRuns(c) {
  return c.steps.filter((st) => (st.proposed || []).length > 0 && st.accepted === st.proposed.length).length;
}

function caseBox(parent, c, method) {
  const box = html('div', { cls: 'sv-col sv-spec-case', parent });
  box.dataset.kind = c.kind;
  html('p', { cls: 'sv-sub', text: KIND_TITLE[c.kind] || c.kind, parent: box });
  const prompt = html('p', { cls: 'sv-prompt', parent: box });
  html('span', { cls: 'sv-prompt-label', text: 'Prompt: ', parent: prompt });
  html('q', { text: c.prompt, parent: prompt }).dataset.setting = '';
  steps(box, c);
  const cost = passCost(c);
  // Copying a passage the prompt holds is prompt lookup's best case, not a typical speed-up.
  const how = /lookup/i.test(method || '') ? 'prompt lookup' : method;
  const best = c.kind === 'rewrite';
  readouts(box, [
    ['accepted', `${formatInt(c.accepted)} of ${formatInt(c.proposed)} proposed`, 'measured', 'accepted'],
    ['acceptance rate', `${formatFixed(c.acceptance_rate * 100, 0)} %`, 'computed', 'rate'],
    ['runs fully accepted, each + a bonus token', formatInt(fullRuns(c)), 'measured', 'bonus'],
    ['plain / speculative', `${formatMs(c.plain_ms)} / ${formatMs(c.spec_ms)}`, 'measured', 'times'],
    ...(cost ? [['one pass, plain / speculative (average)', `${formatMs(cost.plain)} / ${formatMs(cost.spec)} = ×${formatFixed(cost.ratio, 1)}`,
      'computed', 'pass-cost']] : []),
    [best ? `speed-up (${how}, its best case)` : `speed-up (${how})`, `×${formatFixed(c.speedup, 2)}`, 'computed', 'speedup'],
    ['same text as plain decoding', c.identical ? 'yes' : 'no', 'measured', 'identical'],
  ]);
  box.dataset.method = method;
}

// One sentence from the data: what a checking pass cost against a plain step where most was accepted.
function checkCost(parent, cases) {
  const c = cases.find((x) => x.kind === 'rewrite') || cases[0];
  const cost = c && passCost(c);
  if (!cost) return;
  const p = html('p', { cls: 'sv-note sv-check-cost', parent });
  p.append('A pass that checks proposals is not free: while rewriting, one speculative pass took on average ');
  const v = html('span', { cls: 'sv-num', text: `×${formatFixed(cost.ratio, 1)}`, parent: p });
  v.dataset.provenance = 'computed';
  p.append(' the time of a plain step (each run’s time ÷ its passes). Both averages count the prefill, the longest pass, as one of ');
  value(p, formatInt(c.forwards), 'measured');
  p.append(' speculative passes but one of ');
  value(p, formatInt(c.plain_forwards), 'measured');
  p.append(c.forwards < c.plain_forwards
    ? ' plain ones, so the ratio overstates what a checking pass costs; the recording does not time the prefill apart. '
    : ' plain ones. ');
  p.append(c.speedup > 1 ? 'It still paid, because each pass kept several tokens.' : 'Here that cost was not repaid.');
}

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const r = response.result;
      const legend = html('p', { cls: 'sv-note', parent: el });
      legend.append('Proposer (a setting of this run): ');
      setting(legend, r.method);
      legend.append('. ');
      for (const [k, t] of [['accepted', 'accepted'], ['rejected', 'rejected'], ['bonus', 'the model’s own token']]) {
        html('span', { cls: `sv-chip is-${k}`, text: t, parent: legend });
        legend.append(' ');
      }
      legend.append('(at the first disagreement, or a bonus after a fully accepted run).');
      const pair = html('div', { cls: 'sv-pair', parent: el });
      for (const c of r.cases) caseBox(pair, c, r.method);
      checkCost(el, r.cases);
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
