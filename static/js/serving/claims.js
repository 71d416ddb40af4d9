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
// "8", "8 and 16", "4, 8 and 16"
const andList = (xs) => (xs.length < 2 ? xs.join('') : `${xs.slice(0, -1).join(', ')} and ${xs[xs.length - 1]}`);
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
    // "fell" where the tokens for everyone went down from the batch before; "did not rise by more than" elsewhere
    const at = (p) => pts[pts.indexOf(p) - 1];
    const fell = pts.filter((p) => stopped.includes(p.batch) && p.aggregate_tps < at(p).aggregate_tps);
    const flat = pts.filter((p) => stopped.includes(p.batch) && !fell.includes(p));
    const batches = (list) => [andList(list.map((p) => formatInt(p.batch))), 'setting'];
    const said = [];
    if (flat.length) {
      said.push('did not rise by more than ', [`${formatFixed(SAME_WITHIN * 100, 0)} %`, 'setting'], ' at batch ', batches(flat));
    }
    if (fell.length) {
      if (flat.length) said.push(' and ');
      said.push('fell at batch ', batches(fell), ' (', [andList(fell.map((p) => change(p.aggregate_tps, at(p).aggregate_tps))),
        'computed'], ' from the batch before)');
    }
    parts.push('; the tokens for everyone ', ...said, ', where a bigger batch stopped paying.');
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

// Where the recorded prefill sits against the decode points, and why: the bytes a step moves are its FLOPs
// over its intensity (FLOPs = its rate times its measured time), so a prompt run on float32 copies, four bytes
// a weight, moves far more than a decode step on packed int4 weights and its intensity stays lower.
const movedBytes = (p) => (p.flops_s * p.step_ms) / 1000 / p.intensity;

export function roofPrefillClaim(result, source = 'recorded') {
  const pts = ((result && result.roofline && result.roofline.points) || [])
    .filter((p) => [p.intensity, p.flops_s, p.step_ms].every(Number.isFinite));
  const prefill = pts.find((p) => p.phase === 'prefill');
  const decodes = pts.filter((p) => p.phase === 'decode').sort((a, b) => a.batch - b.batch);
  if (!prefill || !decodes.length) return null;
  const right = decodes.filter((p) => p.intensity > prefill.intensity);
  const first = decodes[0];
  const parts = [`${runWords(source)}, the `, [formatInt(prefill.tokens), 'setting'], '-token prefill sits at ',
    [`${formatFixed(prefill.intensity, 1)} FLOP/B`, 'computed']];
  if (!right.length) {
    const farthest = decodes.reduce((a, b) => (b.intensity > a.intensity ? b : a));
    parts.push(', right of every decode point (the farthest right, batch ', [formatInt(farthest.batch), 'setting'], ', at ',
      [`${formatFixed(farthest.intensity, 1)} FLOP/B`, 'computed'], ').');
    return { id: 'roof-prefill-side', rightOf: [], parts };
  }
  parts.push(', left of the decode point', right.length > 1 ? 's' : '', ' at batch ',
    [andList(right.map((p) => formatInt(p.batch))), 'setting'], ' (',
    [`${andList(right.map((p) => formatFixed(p.intensity, 1)))} FLOP/B`, 'computed'], ')');
  // the reason in bytes, said only where the recording's own kernels show the prompt ran on float32 copies
  if (prefill.kernel === 'float32 GEMM' && first.kernel && first.kernel !== prefill.kernel) {
    parts.push(': its layers ran on the float32 weights, four bytes a weight, and it moved ', [formatSize(movedBytes(prefill)), 'computed'],
      ', while a batch-', [formatInt(first.batch), 'setting'], ' decode step on the ', first.kernel, ' moved ',
      [formatSize(movedBytes(first)), 'computed'], '.');
  } else parts.push('.');
  return { id: 'roof-prefill-side', rightOf: right.map((p) => p.batch), parts };
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
    parts.push(': in this run neither paid more than ', [`${formatFixed(SAME_WITHIN * 100, 0)} %`, 'setting'], '.');
  }
  return { id: 'chunked-price', decodersPaid, longPaid, parts };
}

// ---- prefix caching: what the skipped prefill bought ----------------------------------------------------

// The time to first token fell "roughly in step with the work skipped" when its cut was at least IN_STEP of
// the tokens prefilled's cut; "by less than" down to PART_OF; below, "far less", not proportional.
export const IN_STEP = 0.8;
export const PART_OF = 0.3;

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
  if (!(workCut > 0)) return null; // nothing skipped: no cut to set the time's beside
  const inStep = timeCut / workCut;
  const proportional = inStep >= IN_STEP;
  const parts = ['Here the requests that found the prefix cached prefilled ', [formatFixed(prefilledOn, 0), 'computed'],
    ' tokens on average instead of ', [formatFixed(prefilledOff, 0), 'computed'], ' (', [change(prefilledOn, prefilledOff), 'computed'],
    '), and their time to first token went from ', [formatMs(ttftOff), 'computed'], ' to ', [formatMs(ttftOn), 'computed'],
    ' (', [change(ttftOn, ttftOff), 'computed'], ')'];
  const cutSize = [`${formatFixed(inStep * 100, 0)} %`, 'computed'];
  if (proportional) {
    parts.push(': roughly in step with the work skipped, a cut ', cutSize, ' the size of the tokens\' (at least ',
      [`${formatFixed(IN_STEP * 100, 0)} %`, 'setting'], ').');
  } else if (inStep >= PART_OF) {
    parts.push(': it fell by less than the tokens prefilled, a cut ', cutSize, ' the size of theirs: part of the time '
      + 'to first token does not shrink with the tokens prefilled.');
  } else {
    parts.push(': time to first token fell far less than the tokens prefilled (a cut ', cutSize, ' the size of '
      + 'theirs, under ', [`${formatFixed(PART_OF * 100, 0)} %`, 'setting'], '), so in this run the time to first token '
      + 'is not proportional to the tokens prefilled.');
  }
  if (misses.length) {
    const q = misses[0];
    parts.push(' The request that found nothing cached moved by ', [change(q.ttft_ms, before[q.request].ttft_ms), 'computed'],
      ' between the two runs: the scatter of one run against the other.');
  }
  return { id: 'prefix-ttft', proportional, inStep, parts };
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

export const CLAIMS = { why_batch: [whyBatchClaim, roofBatchClaim, roofPrefillClaim], chunked_prefill: [chunkedClaim], prefix_caching: [prefixClaim],
  speculative: [speculativeClaim], paged_blocks: [pagedClaim] };
