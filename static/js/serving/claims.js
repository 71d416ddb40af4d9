// The serving chapter's sentences that relate figures, each computed from the run it speaks of: a claim
// is a function of one experiment's result (and its source: 'live' for a run just made on this server,
// else the shipped recording) that returns the sentence as parts (plain text, or
// [text, provenance] for a figure), choosing its words by a stated condition, so a recording that
// contradicts a sentence changes the sentence. Pure: no DOM (serving/index.js renders the parts).
import { formatFixed, formatInt, formatMs, formatSize } from '../shared/format.js';
import { median } from '../shared/stats.js';

// A relative change in words and figures: 1.62 → "+62 %", 0.27 → "−73 %".
export function change(after, before) {
  const r = after / before - 1;
  return `${r >= 0 ? '+' : '−'}${formatFixed(Math.abs(r) * 100, 0)} %`;
}

// How a sentence names the run it speaks of: a run made on this server just now, or the shipped recording.
export function runWords(source, article = 'the') {
  return source === 'live' ? 'In this run' : `In ${article} recording`;
}

const times = (x) => `×${formatFixed(x, 1)}`;
const sum = (xs) => xs.reduce((a, b) => a + b, 0);
// Runs of the same workload differ by this much or less and it is called "about the same".
export const SAME_WITHIN = 0.05;

// ---- why batch: does a bigger batch still pay? ------------------------------------------------------

// A step up in batch paid when the tokens for everyone (aggregate) rose by more than SAME_WITHIN.
const paid = (points, i) => points[i].aggregate_tps > points[i - 1].aggregate_tps * (1 + SAME_WITHIN);

// The batch sizes past the last step up that paid, where a bigger batch stopped paying: [] while the last
// step still paid. A plateau followed by a later gain is not a stop, so its batches are not listed.
export function stoppedPaying(points) {
  let lastGain = 0;
  for (let i = 1; i < points.length; i += 1) if (paid(points, i)) lastGain = i;
  return points.slice(lastGain + 1).map((p) => p.batch);
}

export function whyBatchClaim(result, source = 'recorded') {
  const pts = (result && result.points || []).filter((p) => Number.isFinite(p.step_ms));
  if (pts.length < 2) return null;
  const a = pts[0];
  const z = pts[pts.length - 1];
  const stopped = stoppedPaying(pts);
  const parts = [`${runWords(source)}, from batch `, [formatInt(a.batch), 'setting'], ' to ', [formatInt(z.batch), 'setting'],
    ' the step grew ', [times(z.step_ms / a.step_ms), 'computed'], ' (', [formatMs(a.step_ms), 'measured'], ' to ',
    [formatMs(z.step_ms), 'measured'], ') while the batch grew ', [times(z.batch / a.batch), 'computed'],
    ', so the tokens for everyone rose ', [times(z.aggregate_tps / a.aggregate_tps), 'computed'],
    ' and each user\'s own stream fell to ', [`${formatFixed((z.per_user_tps / a.per_user_tps) * 100, 0)} %`, 'computed'],
    ' of its batch-1 rate'];
  if (stopped.length) {
    parts.push('; the tokens for everyone did not rise by more than ', [`${formatFixed(SAME_WITHIN * 100, 0)} %`, 'computed'],
      ' at batch ', [stopped.map(formatInt).join(', '), 'setting'], ', where a bigger batch stopped paying.');
  } else {
    parts.push('; every step up in batch still paid here.');
  }
  return { id: 'why-batch-pays', stoppedAt: stopped, parts };
}

// What the roofline found at the two ends of the batch range: how much of each step its own kernels fill,
// and what holds it back (serving_experiments/roofline.py's held_by, from the same measured figures).
const HELD_WORDS = {
  kernel: 'its own kernels\' arithmetic, not memory or overhead, holds it back',
  'kernel-streaming': 'its own kernels hold it back, reading their weights at half the copy bandwidth or more',
  memory: 'its bytes at the copy bandwidth take longer than its kernels and hold it back',
  overhead: 'neither its kernels nor its bytes fill half of it: the rest is overhead',
};

export function roofBatchClaim(result, source = 'recorded') {
  const rl = result && result.roofline;
  const decodes = ((rl && rl.points) || []).filter((p) => p.phase === 'decode' && Number.isFinite(p.kernel_ms))
    .sort((a, b) => a.batch - b.batch);
  if (decodes.length < 2) return null;
  const ends = [decodes[0], decodes[decodes.length - 1]];
  const parts = [`${runWords(source)}: `];
  ends.forEach((p, i) => {
    parts.push(i ? '; at batch ' : 'at batch ', [formatInt(p.batch), 'setting'], ' the kernels alone took ',
      [formatMs(p.kernel_ms), 'measured'], ' of a ', [formatMs(p.step_ms), 'measured'], ' step (',
      [`${formatFixed((p.kernel_ms / p.step_ms) * 100, 0)} %`, 'computed'], '): ', HELD_WORDS[p.held_by] || p.verdict);
  });
  parts.push('.');
  return { id: 'roof-batch', heldBy: ends.map((p) => p.held_by), parts };
}

// ---- chunked prefill: who pays for the cure -----------------------------------------------------------

// One run's decoders: the total time of their gaps (mean over the decoders), the longest gap, and how
// one decoder's gaps (every decoder shares each step, so their gaps are the same steps).
function decoders(run) {
  const rows = run.gaps_ms || [];
  return { total: rows.length ? sum(rows.map(sum)) / rows.length : NaN, longest: run.max_gap_ms, ttft: run.long_ttft_ms,
    gaps: rows[0] || [] };
}

export function chunkedClaim(result) {
  const off = result && result.runs && result.runs.off;
  const on = result && result.runs && result.runs.on;
  if (!off || !on) return null;
  const a = decoders(off);
  const b = decoders(on);
  if (![a.total, b.total, a.ttft, b.ttft, a.longest, b.longest].every(Number.isFinite)) return null;
  const decodersPaid = b.total > a.total * (1 + SAME_WITHIN);
  const longPaid = b.ttft > a.ttft * (1 + SAME_WITHIN);
  const slowed = b.gaps.filter((g) => g > 1.5 * median(a.gaps)).length;
  const parts = ['Here the longest gap went from ', [formatMs(a.longest), 'measured'], ' to ', [formatMs(b.longest), 'measured'],
    b.longest < a.longest ? ', the stall the cure is for. ' : ': chunking did not shorten it in this run. '];
  parts.push('The long prompt\'s own time to first token went from ', [formatMs(a.ttft), 'measured'], ' to ',
    [formatMs(b.ttft), 'measured'], ' (', [change(b.ttft, a.ttft), 'computed'], '), and the decoders\' gaps added up to ',
    [formatMs(b.total), 'computed'], ' against ', [formatMs(a.total), 'computed'], ' (', [change(b.total, a.total), 'computed'], ')');
  if (decodersPaid && longPaid) {
    parts.push(': both paid. The one long stall became ', [formatInt(slowed), 'computed'],
      ' gaps of more than ', ['1.5', 'setting'], ' times the unchunked run\'s median, each step beside a chunk doing that chunk\'s work too.');
  } else if (decodersPaid) {
    parts.push(': the decoders paid, in ', [formatInt(slowed), 'computed'], ' gaps of more than ', ['1.5', 'setting'], ' times the unchunked run\'s median.');
  } else if (longPaid) {
    parts.push(': the price fell on the long prompt, not on the decoders.');
  } else {
    parts.push(': in this run neither paid more than ', [`${formatFixed(SAME_WITHIN * 100, 0)} %`, 'computed'], '.');
  }
  return { id: 'chunked-price', decodersPaid, longPaid, parts };
}

// ---- prefix caching: what the skipped prefill bought ----------------------------------------------------

export function prefixClaim(result) {
  const off = result && result.runs && result.runs.off && result.runs.off.requests;
  const on = result && result.runs && result.runs.on && result.runs.on.requests;
  if (!off || !on) return null;
  const byName = (list) => Object.fromEntries(list.map((q) => [q.request, q]));
  const before = byName(off);
  const hits = on.filter((q) => q.cached_tokens > 0 && before[q.request]);
  const misses = on.filter((q) => q.cached_tokens === 0 && before[q.request]);
  if (!hits.length) return null;
  const mean = (list, f) => sum(list.map(f)) / list.length;
  const prefilledOff = mean(hits, (q) => before[q.request].prefill_tokens);
  const prefilledOn = mean(hits, (q) => q.prefill_tokens);
  const ttftOff = mean(hits, (q) => before[q.request].ttft_ms);
  const ttftOn = mean(hits, (q) => q.ttft_ms);
  const workCut = 1 - prefilledOn / prefilledOff;
  const timeCut = 1 - ttftOn / ttftOff;
  const proportional = timeCut >= workCut / 2;
  const parts = ['Here the requests that found the prefix cached prefilled ', [formatFixed(prefilledOn, 0), 'computed'],
    ' tokens on average instead of ', [formatFixed(prefilledOff, 0), 'computed'], ' (', [change(prefilledOn, prefilledOff), 'computed'],
    '), and their time to first token went from ', [formatMs(ttftOff), 'computed'], ' to ', [formatMs(ttftOn), 'computed'],
    ' (', [change(ttftOn, ttftOff), 'computed'], ')'];
  parts.push(proportional ? ': roughly in step with the work skipped.'
    : ': time to first token fell far less than the tokens prefilled, so in this run the time to first token is not '
      + 'proportional to the tokens prefilled.');
  if (misses.length) {
    const q = misses[0];
    parts.push(' The request that found nothing cached moved by ', [change(q.ttft_ms, before[q.request].ttft_ms), 'computed'],
      ' between the two runs: the scatter of one run against the other.');
  }
  return { id: 'prefix-ttft', proportional, parts };
}

// ---- paged blocks: did paging save memory in this run? -------------------------------------------------------

export function pagedClaim(result, source = 'recorded') {
  if (!result || ![result.reserved_bytes, result.contiguous_bytes].every(Number.isFinite) || !result.window_bytes) return null;
  const saved = result.reserved_bytes < result.contiguous_bytes;
  const parts = [`${runWords(source, 'this')} the blocks reserved `, [formatSize(result.reserved_bytes), 'computed'],
    ' at their peak against ', [formatSize(result.contiguous_bytes), 'computed'],
    ' for exact per-request reservations of prompt plus maximum answer'];
  parts.push(saved
    ? ': paging saved memory even against reservations sized to each request.'
    : ': here the whole blocks held at least as much as exact reservations would have. Paging pays when a '
      + 'request\'s maximum is far above what it uses.');
  return { id: 'paged-vs-contiguous', saved, parts };
}

// ---- speculative decoding: did the checked text match the plain run's? ---------------------------------------

export function speculativeClaim(result, source = 'recorded') {
  const cases = (result && result.cases) || [];
  if (!cases.length || cases.some((c) => typeof c.identical !== 'boolean')) return null;
  const same = cases.filter((c) => c.identical).length;
  const parts = [`${runWords(source, 'this')} `, [`${formatInt(same)} of ${formatInt(cases.length)}`, 'measured'],
    same === cases.length ? ' speculative texts matched the plain run\'s token for token.'
      : ' speculative texts matched the plain run\'s token for token; the others differ, as rounding allows.'];
  return { id: 'speculative-same', same, parts };
}

// ---- every claim of the chapter, by the experiment it reads ----------------------------------------------

export const CLAIMS = { why_batch: [whyBatchClaim, roofBatchClaim], chunked_prefill: [chunkedClaim], prefix_caching: [prefixClaim],
  speculative: [speculativeClaim], paged_blocks: [pagedClaim] };
