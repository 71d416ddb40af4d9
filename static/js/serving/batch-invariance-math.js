// "Why the same prompt can answer differently": the stage's sentences and figures computed from one run of
// the batch_invariance experiment (serving_experiments/experiments/batch_invariance.py). Pure: no DOM. A
// sentence is returned as parts (plain text, or [text, provenance] for a figure) and its words follow the data.
import { formatFixed, formatInt, formatMs } from '../shared/format.js';

export const MODES = [['default', 'Default route'], ['invariant', 'Batch-invariant mode']];

const times = (x) => `×${formatFixed(x, 2)}`;
// A logit gap below this is called a near-tie here: a sum changed in rounding can tip it. The sentence names
// the threshold, since the route's own description uses a wider one (0.5 logits) for its accuracy check.
export const NEAR_TIE = 0.1;

// How many batched answers were the lone ones, and of how many.
export function agreement(run) {
  const requests = run?.requests || [];
  return { same: requests.filter((r) => r.same_answer).length, of: requests.length };
}

// Tokens (over all requests, up to where each parted) whose chosen probability was the same float alone and
// batched. A request counts its same-float tokens over the whole answer, so for one that parted, `same` is only
// a bound (capped at the parting); `exact` says whether every parted request had none, when the count is exact.
export function sameBits(run) {
  const requests = run?.requests || [];
  const upto = (r) => r.parts_at ?? r.compared_tokens;
  const compared = requests.reduce((n, r) => n + upto(r), 0);
  const same = requests.reduce((n, r) => n + Math.min(r.same_prob_tokens, upto(r)), 0);
  const exact = requests.every((r) => r.parts_at == null || r.same_prob_tokens === 0);
  return { same, compared, exact };
}

// A logit gap with its sign and four decimals: +0.0123.
export function gapText(gap) {
  if (!Number.isFinite(gap)) return '–';
  return `${gap >= 0 ? '+' : '−'}${formatFixed(Math.abs(gap), 4)}`;
}

// Tokens per second, with the digits that tell two runs apart: 75.8, 8.77, 0.092.
export function rateText(x) {
  if (!Number.isFinite(x)) return '–';
  return formatFixed(x, x >= 10 ? 1 : x >= 1 ? 2 : 3);
}

// The loads a run's times were taken at: [start, end] for a recording (recorded_on.load_1m, load_1m_end),
// [end] for a live answer (machine.load_1m, read as it was built).
export function loadsOf(machine = {}, recordedOn = null) {
  const loads = recordedOn ? [recordedOn.load_1m, recordedOn.load_1m_end ?? machine.load_1m] : [machine.load_1m];
  return loads.filter(Number.isFinite);
}

// "0.96 → 1.10", or one load.
export function loadText(loads) {
  return loads.map((l) => formatFixed(l, 2)).join(' → ');
}

// Routes whose linear layers round a decode step's inputs to bfloat16 (model_runner/loading/quantize.py MM_DTYPE);
// attention's products and the head's rescoring stay float32.
const BFLOAT16_INPUTS = ['int4', 'int8'];
const BFLOAT16_BITS = 8; // significant bits of a bfloat16 (7 stored, 1 implied): a step is 2^-8 to 2^-7 of the value

function partingParts(p, route) {
  const a = p.alone.logit_gap;
  const b = p.batched.logit_gap;
  const otherWay = Math.sign(a) !== Math.sign(b);
  const parts = ['. Request ', [p.request, 'measured'], ' parted at token ', [formatInt(p.index + 1), 'measured'],
    ', where its two candidates were ', [formatFixed(Math.abs(a), 4), 'computed'],
    ' apart in logits alone and ', [formatFixed(Math.abs(b), 4), 'computed'],
    otherWay ? ' apart the other way in the batch' : ' apart in the batch'];
  if (Math.max(Math.abs(a), Math.abs(b)) < NEAR_TIE) {
    parts.push(': a near-tie (under ', [formatFixed(NEAR_TIE, 1), 'setting'], ' logits), tipped by a changed sum');
  }
  if (BFLOAT16_INPUTS.includes(route)) {
    // a swing of hundredths of a logit is far more than float32 rounding moves a sum: the bfloat16 inputs amplify it
    parts.push('. The gap moved by ', [formatFixed(Math.abs(a - b), 4), 'computed'], ' logits, far more than reordering a '
      + 'float32 sum moves it: on the ', [route, 'setting'], ' route each linear layer of a decode step rounds its inputs to bfloat16 (',
    [formatInt(BFLOAT16_BITS), 'setting'], ' significant bits), so a sum that changed in its lowest bits can round to the next '
      + 'bfloat16 value, a step of ', [`${formatFixed(100 / 2 ** BFLOAT16_BITS, 1)} to ${formatFixed(200 / 2 ** BFLOAT16_BITS, 1)} %`,
      'computed'], ' of its size, and the layers after carry that step forward.');
  } else parts.push('.');
  return parts;
}

// How many tokens' probabilities changed before the answers parted (or over all of them when none did).
function sumsParts(run, bits) {
  if (!bits.compared) return [];
  const parted = run.requests.some((r) => r.parts_at != null);
  const changed = bits.compared - bits.same;
  if (!changed && !bits.exact) return []; // a bound of "at least 0" says nothing
  const lead = parted ? ' Counting each answer up to where it parted, if it did, ' : ' Over the whole answers, ';
  if (!changed) {
    return [lead, 'all ', [formatInt(bits.compared), 'measured'],
      ' tokens were chosen with the same probability, to the last bit, as alone.'];
  }
  return [lead, bits.exact ? '' : 'at least ', [formatInt(changed), 'measured'], ' of ',
    [formatInt(bits.compared), 'measured'], ' tokens were chosen with a probability that was not the same float as',
    ' alone: the sums changed even where the choice held.'];
}

// The first sentence: what the default route did with the batch.
export function defaultClaim(result, machine = {}) {
  const run = result?.runs?.default;
  if (!run) return null;
  const { same, of } = agreement(run);
  const parts = ['In this run, on the default route, ', [formatInt(same), 'measured'], ' of ', [formatInt(of), 'setting'],
    ' answers came back from the batch as they were alone'];
  const p = run.first_parting;
  if (p && Number.isFinite(p.alone?.logit_gap) && Number.isFinite(p.batched?.logit_gap)) parts.push(...partingParts(p, machine.route));
  else parts.push('.');
  parts.push(...sumsParts(run, sameBits(run)));
  return { id: 'invariance-default', parts };
}

// What the step ratios say: on a machine whose load was above its threads the times are mostly other
// processes' waits; on a quiet one, a mode slower in both is its extra work, faster in both is not its cost.
function costVerdict(ratios, loads, threads) {
  if (loads.length && Number.isFinite(threads) && Math.max(...loads) > threads) {
    return [', but at a load of ', [loadText(loads), 'measured'], ' on ', [formatInt(threads), 'measured'],
      ' threads these times are mostly the other processes\' share of the machine, not the mode\'s cost.'];
  }
  if (ratios.every((r) => r > 1)) return [': the padding rows, the row-by-row attention and the separate prompt passes cost time.'];
  if (ratios.every((r) => r < 1)) return ['; the mode was not slower in this run.'];
  return ['.'];
}

// The second sentence: the mode's answers and what it cost, against the default's, with the load it ran at.
export function modeClaim(result, machine = {}, recordedOn = null) {
  const run = result?.runs?.invariant;
  const base = result?.runs?.default;
  if (!run || !base) return null;
  const { same, of } = agreement(run);
  const bits = sameBits(run);
  const parts = ['With the mode on, ', [formatInt(same), 'measured'], ' of ', [formatInt(of), 'setting'],
    ' answers were the lone ones'];
  if (bits.compared && bits.exact) {
    parts.push(bits.same === bits.compared ? ', every token\'s probability the same to the last bit'
      : ', though not every token\'s probability was the same to the last bit');
  }
  const a = base.step_ms_median;
  const b = run.step_ms_median;
  if (![a?.alone, b?.alone, a?.batched, b?.batched].every(Number.isFinite)) {
    parts.push('.');
    return { id: 'invariance-mode', parts };
  }
  const ratios = [b.alone / a.alone, b.batched / a.batched];
  parts.push('. Its median step took ', [times(ratios[0]), 'computed'], ' the default\'s for a lone request (',
    [formatMs(a.alone), 'measured'], ' to ', [formatMs(b.alone), 'measured'], ') and ',
    [times(ratios[1]), 'computed'], ' in the batch (', [formatMs(a.batched), 'measured'], ' to ',
    [formatMs(b.batched), 'measured'], ')', ...costVerdict(ratios, loadsOf(machine, recordedOn), machine.threads));
  return { id: 'invariance-mode', parts };
}

export const CLAIMS = [defaultClaim, modeClaim];
