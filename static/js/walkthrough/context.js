// The recorded run in context: which route, machine and load it was recorded on, how its per-token
// prefill/decode ratio compares with the serving chapter's pricing run, and what the serving chapter's
// roofline says about prefill and decode on the machine that recorded it. Pure: facts from (run, serving trace), no DOM.
// A field a trace lacks gives MISSING, and a sentence whose data is absent is left out (null).
import { MISSING, formatFixed, formatInt, formatMs } from '../shared/format.js';
import { median } from '../shared/stats.js';
import { pointVerdict } from '../shared/roofline.js';
import { CARRIED, NOT_CARRIED_WORDS, rooflineEvidence } from '../shared/evidence.js';
import { decoderOf, floatPrefillOf, kernelsOf, routeName, routeOf, servingRoute } from '../shared/route.js';

// The route a walkthrough run took: its recording's own field first, else its model's facts.
export function runRoute(run) {
  return routeName(run.recordedOn && run.recordedOn.route) || routeOf(run.model);
}

// Where a walkthrough trace was recorded, in words: "int4 weights · x86_64, 2 CPUs · on transformers' forward ·
// load 1.29 → 1.30".
export function recordedOn(run) {
  const on = run.recordedOn || {};
  const route = runRoute(run);
  const cpus = Number.isFinite(on.cpus) ? `, ${formatInt(on.cpus)} CPUs` : '';
  const machine = on.machine ? `${on.machine}${cpus}` : null;
  const before = on.load_1min_before ?? on.load_1m;
  const after = on.load_1min_after ?? on.load_1m_end;
  let load = null;
  if (Number.isFinite(before)) load = Number.isFinite(after) ? `${before.toFixed(2)} → ${after.toFixed(2)}` : before.toFixed(2);
  return { route, machine, load, decoder: decoderOf(on) };
}

export function recordedOnText(run) {
  const { route, machine, load, decoder } = recordedOn(run);
  const parts = [route ? `${route} weights` : 'route not recorded', machine || 'machine not recorded', `on ${decoder}`,
    load ? `load ${load}` : 'load not recorded'];
  return parts.join(' · ');
}

// Decode step time against prefill time per prompt position, for this run: how many prompt positions
// one new token costs. null when the run has no prefill or no decode step yet.
export function stepVsPrefill(run) {
  const steps = run.tokens.slice(1).map((t) => t.stepMs).filter(Number.isFinite);
  const n = run.prefill.tokens;
  if (!steps.length || !Number.isFinite(run.prefill.ms) || !n) return null;
  const perPosition = run.prefill.ms / n;
  const step = median(steps);
  return { step, perPosition, ratio: step / perPosition };
}

// Two runs of one kind "differ" when one is more than this fraction above the other; nearer, "about the same".
export const SAME_WITHIN = 0.05;

// "shorter than" / "about the same as" / "longer than": a against b, by the SAME_WITHIN rule.
export function compared(a, b, [less, same, more]) {
  if (a > b * (1 + SAME_WITHIN)) return more;
  if (b > a * (1 + SAME_WITHIN)) return less;
  return same;
}

// Why the two recorded ratios differ, worked out from the four times behind them: which of the two (a
// prompt position's time, a decode step's time) moved more between the runs, in which direction, and
// whether this run's attention inspection shows in its steps. Nothing here is said without its figures.
export function ratioReason(ours, pricing, mine, inspected) {
  const theirStep = pricing.decode_ms_per_token;
  const theirPosition = pricing.prefill_ms_per_token;
  const prefillMoved = Math.abs(Math.log(ours.perPosition / theirPosition));
  const stepMoved = Math.abs(Math.log(ours.step / theirStep));
  const longer = mine > pricing.prompt_tokens ? 'this run\'s' : 'the pricing run\'s';
  const longerCost = (mine > pricing.prompt_tokens) === (ours.perPosition > theirPosition) ? 'more' : 'less';
  let text = `The two differ ${prefillMoved >= stepMoved ? 'mostly in the prefill' : 'mostly in the decode step'}: `
    + `a prompt position took ${formatFixed(ours.perPosition, 3)} ms here (${formatInt(mine)} tokens) against `
    + `${formatFixed(theirPosition, 3)} ms there (${formatInt(pricing.prompt_tokens)} tokens), so ${longer} longer prompt `
    + `cost ${longerCost} per position, and a decode step took ${formatMs(ours.step)} against ${formatMs(theirStep)}.`;
  if (inspected) {
    const word = compared(ours.step, theirStep, ['shorter than', 'about the same as', 'longer than']);
    // "yet" only where the extra work did not show; a longer step is what that work would predict
    const link = word === 'longer than' ? 'and' : 'yet';
    text += ` This run also kept each token's attention weights, extra work in every step, ${link} its median step was `
      + `${word} the pricing run's; the two runs were also made at different times, under different loads, so this `
      + 'comparison does not measure that work alone.';
  }
  return `${text} A ratio belongs to one run on one machine, not to the model.`;
}

// The sentence that sets this run's ratio beside the pricing experiment's; null when either is missing.
export function ratioSentence(run, serving) {
  const ours = stepVsPrefill(run);
  const pricing = serving && serving.experiments && serving.experiments.pricing;
  const r = pricing && pricing.result;
  if (!ours || !r || !Number.isFinite(r.ratio)) return null;
  const route = runRoute(run);
  const theirs = servingRoute(serving, pricing);
  // the run's own cost shape says whether its prompt ran on float32 copies (int4 with them) or on the route's kernel
  const kernels = kernelsOf(route, run.prefill.tokens, floatPrefillOf(run.model));
  let why = route && theirs && route !== theirs ? `They ran on different routes (${route} here, ${theirs} there). ` : '';
  why += ratioReason(ours, r, run.prefill.tokens, run.inspected);
  return {
    ours: formatFixed(ours.ratio, 1),
    oursDetail: `${formatMs(ours.step)} a step against ${formatFixed(ours.perPosition, 2)} ms a prompt position`
      + (kernels && kernels.prompt !== kernels.decode
        ? `; the prompt ran on the ${kernels.prompt}, each new token on the ${kernels.decode}, so this compares two kernels`
        : ''),
    theirs: formatFixed(r.ratio, 1),
    why,
  };
}

const pct = (share) => `${formatFixed(share * 100, 0)} %`;

// The device the serving chapter's why_batch experiment ran on, in one word ('CPU', 'GPU'), or null.
export function deviceWord(serving) {
  const exp = serving && serving.experiments && serving.experiments.why_batch;
  const device = String((exp && exp.machine && (exp.machine.device || exp.machine.cpu)) || '');
  if (/^cpu\b/i.test(device) || /x86|arm|aarch/i.test(device)) return 'CPU';
  if (/gpu|cuda|nvidia|h100|h200|a100|mps/i.test(device)) return 'GPU';
  return null;
}

// The serving chapter's roofline, or null.
export function rooflineOf(serving) {
  const r = serving && serving.experiments && serving.experiments.why_batch && serving.experiments.why_batch.result;
  return r && r.roofline && Array.isArray(r.roofline.points) ? r.roofline : null;
}

// What the serving chapter's roofline says of prefill and of batch-1 decode, each against the kernels that
// ran it; null without a roofline judged per kernel (one that gives each point's kernel and floors).
export function roofFacts(serving) {
  const rl = rooflineOf(serving);
  if (!rl) return null;
  const prefill = rl.points.find((p) => p.phase === 'prefill');
  const decode = rl.points.filter((p) => p.phase === 'decode').sort((a, b) => a.batch - b.batch)[0];
  if (!prefill || !decode || ![prefill.kernel_ms, decode.kernel_ms, decode.memory_ms].every(Number.isFinite)) return null;
  const pv = pointVerdict(prefill, rl);
  const dv = pointVerdict(decode, rl);
  // a verdict is said only where its evidence carries it (shared/evidence.js); else why none is drawn
  const wb = serving.experiments.why_batch.result;
  const evidence = rooflineEvidence(rl, Object.fromEntries((wb.points || []).map((p) => [p.batch, p.steps_measured])));
  const carried = { prefill: evidence.of(prefill), decode: evidence.of(decode) };
  const said = (point, v) => (carried[point] === CARRIED ? v.verdict : NOT_CARRIED_WORDS[carried[point]]);
  const decodeCarried = carried.decode === CARRIED;
  const kernelShare = decode.kernel_ms / decode.step_ms;
  const roof = rl.held_by_roof ?? 0.5;
  const device = deviceWord(serving);
  const quantized = rl.route === 'int4' || rl.route === 'int8';
  return {
    ridge: `${formatFixed(pv.ridge, 1)} FLOP/B`,
    peak: `${formatFixed(rl.peak_flops_s / 1e9, 0)} GFLOP/s`,
    peakKernel: rl.peak_kernel || 'the compute kernel',
    bandwidth: `${formatFixed(rl.bandwidth_bytes_s / 1e9, 1)} GB/s`,
    prefillTokens: formatInt(prefill.tokens),
    prefillIntensity: `${formatFixed(prefill.intensity, 1)} FLOP/B`,
    prefillSide: pv.side === 'compute-bound' ? 'right of it, on the compute side' : 'left of it, on the memory side',
    prefillKernel: prefill.kernels || prefill.kernel,
    prefillKernelMs: formatMs(prefill.kernel_ms),
    prefillStepMs: formatMs(prefill.step_ms),
    // the kernels' own share of the step, the figure the sentence sets beside "took X of its Y"
    prefillShare: pct(prefill.kernel_ms / prefill.step_ms),
    prefillVerdict: said('prefill', pv),
    decodeKernel: decode.kernels || decode.kernel,
    decodeKernelMs: formatMs(decode.kernel_ms),
    decodeMemoryMs: formatMs(decode.memory_ms),
    decodeStepMs: formatMs(decode.step_ms),
    decodeKernelShare: pct(kernelShare),
    decodeKernelBandwidth: pct(decode.kernel_bandwidth_share),
    decodeRest: pct(1 - dv.share),
    decodeVerdict: said('decode', dv),
    decodeDevice: device,
    // the conditions the decode paragraph's sentences stand on
    // a quantized route's kernels (the sentence speaks of unpacking) on a named device take longer than their
    // bytes and stream them at under half the copy bandwidth
    decodeArithmetic: decodeCarried && quantized && device !== null && decode.kernel_ms > decode.memory_ms
      && decode.kernel_bandwidth_share < roof,
    decodeOverhead: decodeCarried && decode.held_by === 'overhead',
    // the bytes are the longer floor and fill at least half of the step: what the sentence says
    decodeMemory: decodeCarried && decode.memory_ms >= decode.kernel_ms && decode.memory_ms / decode.step_ms >= roof,
    // floors that fail their check bound nothing: no share of a step is computed from them
    floorsHold: evidence.consistent,
  };
}

// Every [data-ctx] fact of the story, as {name: [text, provenance]}; a sentence whose data is absent
// lists its name in `hidden`. `recorded` is the shipped recording's run (the intro describes it even
// while a live run is shown); without it, the run on display.
export function contextFacts(run, serving, recorded = null) {
  const facts = {};
  const hidden = [];
  const shipped = recorded || run;
  facts['recorded-on'] = [recordedOnText(shipped), shipped.measured ? 'measured' : 'schematic'];
  const roof = roofFacts(serving);
  if (roof) {
    // the kernels' names are what the steps ran (settings of the measurement, as the serving chapter tags them)
    Object.assign(facts, {
      ridge: [roof.ridge, 'computed'],
      'roof-peak': [roof.peak, 'measured'],
      'roof-peak-kernel': [roof.peakKernel, 'setting'],
      'roof-bandwidth': [roof.bandwidth, 'measured'],
      'prefill-tokens': [roof.prefillTokens, 'setting'],
      'prefill-intensity': [roof.prefillIntensity, 'computed'],
      'prefill-side': [roof.prefillSide, 'computed'],
      'prefill-kernel': [roof.prefillKernel, 'setting'],
      'prefill-kernel-ms': [roof.prefillKernelMs, 'measured'],
      'prefill-step-ms': [roof.prefillStepMs, 'measured'],
      'prefill-verdict': [roof.prefillVerdict, 'computed'],
      'prefill-share': [roof.prefillShare, 'computed'],
      'decode-kernel': [roof.decodeKernel, 'setting'],
      'decode-kernel-ms': [roof.decodeKernelMs, 'measured'],
      'decode-memory-ms': [roof.decodeMemoryMs, 'computed'],
      'decode-step-ms': [roof.decodeStepMs, 'measured'],
      'decode-kernel-share': [roof.decodeKernelShare, 'computed'],
      'decode-kernel-bandwidth': [roof.decodeKernelBandwidth, 'computed'],
      'decode-rest': [roof.decodeRest, 'computed'],
      'decode-verdict': [roof.decodeVerdict, 'computed'],
    });
    if (roof.decodeDevice) facts['decode-device'] = [roof.decodeDevice, 'setting'];
    if (roof.floorsHold) hidden.push('roof-prefill-no-floors', 'roof-decode-no-floors');
    else hidden.push('roof-prefill-kernels', 'roof-decode-kernels');
    if (!roof.decodeArithmetic) hidden.push('roof-decode-arithmetic');
    if (!roof.decodeOverhead) hidden.push('roof-decode-overhead');
    if (!roof.decodeMemory) hidden.push('roof-decode-memory');
  } else hidden.push('roof-prefill', 'roof-decode');
  const ratio = run.measured ? ratioSentence(run, serving) : null;
  if (ratio) {
    Object.assign(facts, {
      'ratio-ours': [ratio.ours, 'computed'],
      'ratio-ours-detail': [ratio.oursDetail, 'computed'],
      'ratio-theirs': [ratio.theirs, 'computed'],
      'ratio-why': [ratio.why, 'computed'],
    });
  } else hidden.push('ratio');
  return { facts, hidden };
}
