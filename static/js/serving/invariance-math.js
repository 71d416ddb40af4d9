// "Why the same prompt can answer differently": the stage's sentences and figures computed from one run of
// the batch_invariance experiment (serving_experiments/experiments/batch_invariance.py). Pure: no DOM. A
// sentence is returned as parts (plain text, or [text, provenance] for a figure) and its words follow the data.
import { formatFixed, formatInt, formatMs } from '../shared/format.js';

export const MODES = [['default', 'Default route'], ['invariant', 'Batch-invariant mode']];

const times = (x) => `×${formatFixed(x, 2)}`;
// A logit gap below this is called a near-tie: rounding-sized changes of a sum can tip it.
export const NEAR_TIE = 0.1;

// How many batched answers were the lone ones, and of how many.
export function agreement(run) {
  const requests = run?.requests || [];
  return { same: requests.filter((r) => r.same_answer).length, of: requests.length };
}

// Tokens (over all requests, up to where each parted) whose chosen probability was the same float alone and batched.
export function sameBits(run) {
  const requests = run?.requests || [];
  const compared = requests.reduce((n, r) => n + (r.parts_at ?? r.compared_tokens), 0);
  const same = requests.reduce((n, r) => n + Math.min(r.same_prob_tokens, r.parts_at ?? r.compared_tokens), 0);
  return { same, compared };
}

// A logit gap with its sign and four decimals: +0.0123.
export function gapText(gap) {
  if (!Number.isFinite(gap)) return '–';
  return `${gap >= 0 ? '+' : '−'}${formatFixed(Math.abs(gap), 4)}`;
}

// The first sentence: what the default route did with the batch.
export function defaultClaim(result) {
  const run = result?.runs?.default;
  if (!run) return null;
  const { same, of } = agreement(run);
  const bits = sameBits(run);
  const parts = ['In this run, on the default route, ', [formatInt(same), 'measured'], ' of ', [formatInt(of), 'measured'],
    ' answers came back from the batch as they were alone'];
  const p = run.first_parting;
  if (p && Number.isFinite(p.alone?.logit_gap) && Number.isFinite(p.batched?.logit_gap)) {
    parts.push('. Request ', [p.request, 'measured'], ' parted at token ', [formatInt(p.index + 1), 'measured'],
      ', where its two candidates were ', [formatFixed(Math.abs(p.alone.logit_gap), 4), 'computed'],
      ' apart in logits alone and ', [formatFixed(Math.abs(p.batched.logit_gap), 4), 'computed'],
      ' apart the other way in the batch',
      Math.max(Math.abs(p.alone.logit_gap), Math.abs(p.batched.logit_gap)) < NEAR_TIE
        ? ': a near-tie, tipped by rounding.' : '.');
  } else {
    parts.push('.');
  }
  if (bits.compared) {
    const changed = bits.compared - bits.same;
    parts.push(' Before any parting, ', [formatInt(changed), 'measured'], ' of ', [formatInt(bits.compared), 'measured'],
      changed ? ' tokens were chosen with a probability that differed in its last bits: the sums changed even where the choice held.'
        : ' tokens had a probability that differed in any bit.');
  }
  return { id: 'invariance-default', parts };
}

// The second sentence: the mode's answers and what it cost, against the default's; on a machine whose load
// was above its threads the times are mostly other processes' waits, and the sentence says so.
export function modeClaim(result, machine = {}) {
  const run = result?.runs?.invariant;
  const base = result?.runs?.default;
  if (!run || !base) return null;
  const { same, of } = agreement(run);
  const bits = sameBits(run);
  const parts = ['With the mode on, ', [formatInt(same), 'measured'], ' of ', [formatInt(of), 'measured'],
    ' answers were the lone ones'];
  if (bits.compared) {
    parts.push(bits.same === bits.compared ? ', every token\'s probability the same to the last bit'
      : ', though not every token\'s probability was the same to the last bit');
  }
  const a = base.step_ms_median;
  const b = run.step_ms_median;
  if (Number.isFinite(a?.alone) && Number.isFinite(b?.alone) && Number.isFinite(a?.batched) && Number.isFinite(b?.batched)) {
    parts.push('. Its steps took ', [times(b.alone / a.alone), 'computed'], ' the default\'s for a lone request (',
      [formatMs(a.alone), 'measured'], ' to ', [formatMs(b.alone), 'measured'], ') and ',
      [times(b.batched / a.batched), 'computed'], ' in the batch (', [formatMs(a.batched), 'measured'], ' to ',
      [formatMs(b.batched), 'measured'], ')');
    if (Number.isFinite(machine.load_1m) && Number.isFinite(machine.threads) && machine.load_1m > machine.threads) {
      parts.push(', but at a load of ', [formatFixed(machine.load_1m, 2), 'measured'], ' on ',
        [formatInt(machine.threads), 'measured'], ' threads these times are mostly the other processes\' share of the',
        ' machine, not the mode\'s cost.');
    } else {
      parts.push('.');
    }
  } else {
    parts.push('.');
  }
  return { id: 'invariance-mode', parts };
}

export const CLAIMS = [defaultClaim, modeClaim];
