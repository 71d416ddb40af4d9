// The serving chapter's sentences that relate figures, each computed from the run it speaks of: a claim
// is a function of one experiment's result (and its source: 'live' for a run just made on this server,
// else the shipped recording) that returns the sentence as parts (plain text, or
// [text, provenance] for a figure), choosing its words by a stated condition, so a recording that
// contradicts a sentence changes the sentence. Pure: no DOM (serving/index.js renders the parts).
import { formatFixed, formatInt, formatMs, formatSize } from '../shared/format.js';
import { median } from '../shared/stats.js';
import { CARRIED, NOT_CARRIED_WORDS, rooflineEvidence, rowsOf } from '../shared/evidence.js';

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

// The tokens for everyone at a batch's fastest step (as recorded) and at its median step (computed alike).
const FASTEST = (p) => p.aggregate_tps;
const MEDIAN = (p) => (Number.isFinite(p.step_ms_median) ? (p.batch * 1000) / p.step_ms_median : NaN);

// A step up in batch paid when the tokens for everyone (aggregate, by `rate`) rose by more than SAME_WITHIN.
const paid = (points, i, rate) => rate(points[i]) > rate(points[i - 1]) * (1 + SAME_WITHIN);

// The batch sizes past the last step up that paid, where a bigger batch stopped paying: [] while the last
// step still paid. A plateau followed by a later gain is not a stop, so its batches are not listed.
export function stoppedPaying(points, rate = FASTEST) {
  let lastGain = 0;
  for (let i = 1; i < points.length; i += 1) if (paid(points, i, rate)) lastGain = i;
  return points.slice(lastGain + 1).map((p) => p.batch);
}

// Where the tokens for everyone (by `rate`) stopped rising, in words: "did not rise by more than 5 % at batch
// 8" for a plateau, "fell at batch 16 (−9 % from the batch before)" where they went down.
function stopWords(pts, stopped, rate) {
  const at = (p) => pts[pts.indexOf(p) - 1];
  const fell = pts.filter((p) => stopped.includes(p.batch) && rate(p) < rate(at(p)));
  const flat = pts.filter((p) => stopped.includes(p.batch) && !fell.includes(p));
  const batches = (list) => [andList(list.map((p) => formatInt(p.batch))), 'setting'];
  const said = [];
  if (flat.length) said.push('did not rise by more than ', [`${formatFixed(SAME_WITHIN * 100, 0)} %`, 'setting'], ' at batch ', batches(flat));
  if (fell.length) {
    if (flat.length) said.push(' and ');
    said.push('fell at batch ', batches(fell), ' (', [andList(fell.map((p) => change(rate(p), rate(at(p))))), 'computed'],
      ' from the batch before)');
  }
  return said;
}

const sameList = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// No stop by `rate`: every step up paid, or the tokens for everyone fell or stalled at some batch and rose
// again after it (not a stop, but neither did that step pay: a fall is said as a fall, a stall as a stall).
function noStopWords(pts, rate) {
  const unpaid = pts.filter((p, i) => i > 0 && !paid(pts, i, rate)).map((p) => p.batch);
  if (!unpaid.length) return ['every step up in batch still paid'];
  return ['a bigger batch had not stopped paying: the tokens for everyone ', ...stopWords(pts, unpaid, rate),
    ' but rose again by batch ', [formatInt(pts[pts.length - 1].batch), 'setting']];
}

// The verdict, printed only where the fastest and the median steps agree on it; else the sentence says the
// evidence is mixed and gives each statistic's reading (a verdict needs its evidence).
function whyBatchVerdict(pts) {
  const fast = stoppedPaying(pts, FASTEST);
  if (!pts.every((p) => Number.isFinite(MEDIAN(p)))) {
    return { mixed: true, parts: ['; the recording has no median step to check the fastest against, so it draws no verdict on '
      + 'where a bigger batch stopped paying.'] };
  }
  const mid = stoppedPaying(pts, MEDIAN);
  const steps = [...new Set(pts.map((p) => p.steps_measured).filter(Number.isFinite))];
  const of = steps.length ? [' of ', [steps.map(formatInt).join(' or '), 'measured'], ' steps'] : [];
  if (sameList(fast, mid)) {
    const alike = [', by the fastest', ...of, ' and by their median alike.'];
    if (!fast.length) return { mixed: false, parts: ['; ', ...noStopWords(pts, FASTEST), ' here', ...alike] };
    return { mixed: false, parts: ['; the tokens for everyone ', ...stopWords(pts, fast, FASTEST), ', where a bigger batch stopped paying',
      ...alike] };
  }
  const reading = (stopped, rate) => (stopped.length ? ['the tokens for everyone ', ...stopWords(pts, stopped, rate)]
    : noStopWords(pts, rate));
  const z = pts[pts.length - 1];
  const y = pts[pts.length - 2];
  return { mixed: true, parts: ['; whether a bigger batch stopped paying, the evidence is mixed: by the fastest', ...of, ' ',
    ...reading(fast, FASTEST), '; by their median ', ...reading(mid, MEDIAN), ' (batch ', [formatInt(y.batch), 'setting'], ' to ',
    [formatInt(z.batch), 'setting'], ': ', [`${formatFixed(MEDIAN(y), 1)} to ${formatFixed(MEDIAN(z), 1)} tok/s`, 'computed'],
    '): the two readings disagree, so neither is drawn as the verdict.'] };
}

export function whyBatchClaim(result, source = 'recorded') {
  const pts = (result && result.points || []).filter((p) => Number.isFinite(p.step_ms));
  if (pts.length < 2) return null;
  const a = pts[0];
  const z = pts[pts.length - 1];
  const parts = [`${runWords(source)}, from batch `, [formatInt(a.batch), 'setting'], ' to ', [formatInt(z.batch), 'setting'],
    ' the fastest step grew ', [times(z.step_ms / a.step_ms), 'computed'], ' (', [formatMs(a.step_ms), 'measured'], ' to ',
    [formatMs(z.step_ms), 'measured'], ') while the batch grew ', [times(z.batch / a.batch), 'computed'],
    ', so the tokens for everyone rose ', [times(z.aggregate_tps / a.aggregate_tps), 'computed'],
    ' and each user\'s own stream fell to ', [`${formatFixed((z.per_user_tps / a.per_user_tps) * 100, 0)} %`, 'computed'],
    ' of its batch-1 rate'];
  const verdict = whyBatchVerdict(pts);
  parts.push(...verdict.parts);
  return { id: 'why-batch-pays', stoppedAt: verdict.mixed ? [] : stoppedPaying(pts), stoppedAtFastest: stoppedPaying(pts),
    stoppedAtMedian: pts.every((p) => Number.isFinite(MEDIAN(p))) ? stoppedPaying(pts, MEDIAN) : null, mixed: verdict.mixed, parts };
}

// What the roofline found at the two ends of the batch range: how much of each step its own kernels fill,
// how much is neither its kernels nor its bytes, and what holds it back (serving_experiments/roofline.py's
// held_by) where the evidence carries a verdict (shared/evidence.js): else why it draws none.
const HELD_WORDS = {
  kernel: 'its own kernels\' arithmetic holds it back',
  'kernel-streaming': 'its own kernels hold it back, reading their weights at half the copy bandwidth or more',
  memory: 'its bytes at the copy bandwidth take longer than its kernels and hold it back',
  overhead: 'overhead holds it back, its floors filling under half of it',
};

export function roofBatchClaim(result, source = 'recorded') {
  const rl = result && result.roofline;
  const all = (rl && rl.points) || [];
  const decodes = all.filter((p) => p.phase === 'decode' && Number.isFinite(p.kernel_ms)).sort((a, b) => a.batch - b.batch);
  if (decodes.length < 2) return null;
  const steps = Object.fromEntries(((result && result.points) || []).map((p) => [p.batch, p.steps_measured]));
  const { problems, of } = rooflineEvidence(rl, steps);
  const ends = [decodes[0], decodes[decodes.length - 1]];
  // Floors that fail their check bound nothing, so no share of a step is put down to them either.
  const evidence = ends.map(of);
  if (problems.length) return { id: 'roof-batch', heldBy: [null, null], evidence, parts: floorsFailWords(all, problems, source) };
  const parts = [`${runWords(source)}: `];
  ends.forEach((p, i) => {
    const floor = Math.max(p.kernel_ms, Number.isFinite(p.memory_ms) ? p.memory_ms : 0);
    const outside = p.step_ms - floor;
    parts.push(i ? '; at batch ' : 'at batch ', [formatInt(p.batch), 'setting'], ' the kernels alone took ',
      [formatMs(p.kernel_ms), 'measured'], ' of a ', [formatMs(p.step_ms), 'measured'], ' step (',
      [`${formatFixed((p.kernel_ms / p.step_ms) * 100, 0)} %`, 'computed'], ')');
    if (outside > 0) {
      parts.push(' and ', [formatMs(outside), 'computed'], ' (', [`${formatFixed((outside / p.step_ms) * 100, 0)} %`, 'computed'],
        ') was neither its kernels nor its bytes');
    }
    if (evidence[i] === CARRIED) parts.push(': ', HELD_WORDS[p.held_by] || p.verdict);
  });
  if (evidence.some((e) => e !== CARRIED)) {
    ends.forEach((p, i) => {
      if (evidence[i] !== CARRIED) parts.push('. At batch ', [formatInt(p.batch), 'setting'], ' the verdict: ', NOT_CARRIED_WORDS[evidence[i]]);
    });
  }
  parts.push('.');
  return { id: 'roof-batch', heldBy: ends.map((p, i) => (evidence[i] === CARRIED ? p.held_by : null)), evidence, parts };
}

// The roofline's floors fail their own check (shared/evidence.js): the first problem, in words, and what is
// therefore not said, neither a verdict nor how much of a step its kernels fill.
function floorsFailWords(all, problems, source) {
  const q = problems[0];
  const at = (phase, rows) => all.find((p) => p.phase === phase && rowsOf(p) === rows);
  const p = at(q.phase, q.rows);
  return [`${runWords(source)} the floors fail their own check (`,
    ...(q.kind === 'falls'
      ? ['the floor at batch ', [formatInt(q.rows), 'setting'], ', ', [formatMs(p.kernel_ms), 'measured'],
        ', is below the floor at batch ', [formatInt(q.after), 'setting'], ', ', [formatMs(at('decode', q.after).kernel_ms), 'measured'],
        ', though more rows take no less work']
      : ['the floor of a step is not below the step it bounds']),
    '), so they bound nothing here: no verdict on what holds these steps back is drawn from them, nor how much of a step '
    + 'its kernels fill and how much is neither its kernels nor its bytes.'];
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
  // one threshold for both runs: a gap over 1.5 times the unchunked run's median gap
  const over = (gaps) => gaps.filter((g) => g > 1.5 * median(a.gaps)).length;
  const slowed = over(b.gaps);
  const before = over(a.gaps);
  const parts = ['Here the longest gap went from ', [formatMs(a.longest), 'measured'], ' to ', [formatMs(b.longest), 'measured'],
    b.longest < a.longest ? ', the stall the cure is for. ' : ': chunking did not shorten it in this run. '];
  parts.push('The long prompt\'s own time to first token went from ', [formatMs(a.ttft), 'measured'], ' to ',
    [formatMs(b.ttft), 'measured'], ' (', [change(b.ttft, a.ttft), 'computed'], '), and the decoders\' gaps added up to ',
    [formatMs(b.total), 'computed'], ' against ', [formatMs(a.total), 'computed'], ' (', [change(b.total, a.total), 'computed'], ')');
  if (decodersPaid && longPaid) {
    parts.push(': both paid. Counting the gaps of more than ', ['1.5', 'setting'], ' times the unchunked run\'s median in each run, the ',
      'unchunked run had ', [formatInt(before), 'computed'], ', its stall among them, and the chunked run ', [formatInt(slowed), 'computed'],
      ', each step beside a chunk doing that chunk\'s work too.');
  } else if (decodersPaid) {
    parts.push(': the decoders paid, in ', [formatInt(slowed), 'computed'], ' gaps of more than ', ['1.5', 'setting'],
      ' times the unchunked run\'s median, against ', [formatInt(before), 'computed'], ' in the unchunked run.');
  } else if (longPaid) {
    parts.push(': the price fell on the long prompt, not on the decoders.');
  } else {
    parts.push(': in this run neither paid more than ', [`${formatFixed(SAME_WITHIN * 100, 0)} %`, 'setting'], '.');
  }
  return { id: 'chunked-price', decodersPaid, longPaid, over: { off: before, on: slowed }, parts };
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
  const parts = [`${runWords(source, 'this')} `, [formatInt(same), 'measured'], ' of ', [formatInt(cases.length), 'setting'],
    same === cases.length ? ' speculative texts matched the plain run\'s token for token.'
      : ' speculative texts matched the plain run\'s token for token; the others differ, as rounding allows.'];
  return { id: 'speculative-same', same, parts };
}

// What prompt lookup did on the open question: how many of its steps proposed anything, how many tokens,
// and how many of them were accepted (the recording's own counts, not a general rule).
export function speculativeOpenClaim(result, source = 'recorded') {
  const open = ((result && result.cases) || []).find((c) => c.kind === 'open');
  if (!open || !Array.isArray(open.steps)) return null;
  const proposing = open.steps.filter((s) => (Array.isArray(s.proposed) ? s.proposed.length : s.proposed) > 0).length;
  const parts = [`${runWords(source, 'this')} prompt lookup proposed `, [formatInt(open.proposed), 'measured'], ' tokens in ',
    [formatInt(proposing), 'measured'], ' of its ', [formatInt(open.steps.length), 'measured'], ' steps on the open question, and ',
    [formatInt(open.accepted), 'measured'], open.accepted === 1 ? ' was accepted.' : ' were accepted.'];
  return { id: 'speculative-open', proposing, parts };
}

// ---- every claim of the chapter, by the experiment it reads ----------------------------------------------

export const CLAIMS = { why_batch: [whyBatchClaim, roofBatchClaim, roofPrefillClaim], chunked_prefill: [chunkedClaim], prefix_caching: [prefixClaim],
  speculative: [speculativeClaim, speculativeOpenClaim], paged_blocks: [pagedClaim] };
