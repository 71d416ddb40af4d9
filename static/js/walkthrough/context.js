// The recorded run in context: which route, machine and load it was recorded on, how its per-token
// prefill/decode ratio compares with the serving chapter's pricing run, and what the serving chapter's
// roofline says about prefill and decode on this machine. Pure: facts from (run, serving trace), no DOM.
// A field a trace lacks gives MISSING, and a sentence whose data is absent is left out (null).
import { MISSING, formatFixed, formatInt, formatMs } from '../shared/format.js';
import { median } from '../shared/stats.js';
import { pointVerdict } from '../shared/roofline.js';
import { routeName, routeOf, servingRoute } from '../shared/route.js';

// The route a walkthrough run took: its recording's own field first, else its model's facts.
export function runRoute(run) {
  return routeName(run.recordedOn && run.recordedOn.route) || routeOf(run.model);
}

// Where a walkthrough trace was recorded, in words: "int4 weights · x86_64, 2 CPUs · load 1.29 → 1.30".
export function recordedOn(run) {
  const on = run.recordedOn || {};
  const route = runRoute(run);
  const cpus = Number.isFinite(on.cpus) ? `, ${formatInt(on.cpus)} CPUs` : '';
  const machine = on.machine ? `${on.machine}${cpus}` : null;
  const before = on.load_1min_before ?? on.load_1m;
  const after = on.load_1min_after ?? on.load_1m_end;
  let load = null;
  if (Number.isFinite(before)) load = Number.isFinite(after) ? `${before.toFixed(2)} → ${after.toFixed(2)}` : before.toFixed(2);
  return { route, machine, load };
}

export function recordedOnText(run) {
  const { route, machine, load } = recordedOn(run);
  const parts = [route ? `${route} weights` : 'route not recorded', machine || 'machine not recorded',
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

// Why two recorded ratios may disagree, from what each recording says about itself.
function ratioWhy(ours, theirs, mine, pricing, inspected) {
  return ratioReason(ours, theirs, mine, pricing) + (inspected
    ? ' This run also kept each token\'s attention weights, which makes its decode steps about a fifth slower '
      + '(docs/performance.md); the pricing run kept none.'
    : '');
}

function ratioReason(ours, theirs, mine, pricing) {
  const prompts = `${formatInt(mine)}-token and ${formatInt(pricing)}-token prompts`;
  if (ours && theirs && ours !== theirs) {
    return `They are different runs on different routes (${ours} here, ${theirs} there) with ${prompts}: `
      + 'the route changes both costs, and a longer prompt spreads a prefill over more positions, so the ratio '
      + 'belongs to one run, not to the model.';
  }
  return `They are different runs (${prompts}${ours ? `, both ${ours}` : ''}): a longer prompt spreads a prefill `
    + 'over more positions, and load on the machine stretches either time, so the ratio belongs to one run.';
}

// The sentence that sets this run's ratio beside the pricing experiment's; null when either is missing.
export function ratioSentence(run, serving) {
  const ours = stepVsPrefill(run);
  const pricing = serving && serving.experiments && serving.experiments.pricing;
  const r = pricing && pricing.result;
  if (!ours || !r || !Number.isFinite(r.ratio)) return null;
  return {
    ours: formatFixed(ours.ratio, 1),
    oursDetail: `${formatMs(ours.step)} a step against ${formatFixed(ours.perPosition, 2)} ms a prompt position`,
    theirs: formatFixed(r.ratio, 1),
    why: ratioWhy(runRoute(run), servingRoute(serving, pricing), run.prefill.tokens, r.prompt_tokens, run.inspected),
  };
}

const pct = (share) => `${formatFixed(share * 100, 0)} %`;

// What the serving chapter's roofline says of prefill and of batch-1 decode; null without a roofline.
export function roofFacts(serving) {
  const rl = serving && serving.experiments && serving.experiments.why_batch
    && serving.experiments.why_batch.result && serving.experiments.why_batch.result.roofline;
  if (!rl || !Array.isArray(rl.points)) return null;
  const prefill = rl.points.find((p) => p.phase === 'prefill');
  const decode = rl.points.filter((p) => p.phase === 'decode').sort((a, b) => a.batch - b.batch)[0];
  if (!prefill || !decode) return null;
  const pv = pointVerdict(prefill, rl);
  const dv = pointVerdict(decode, rl);
  const bytesPerS = decode.flops_s / decode.intensity;
  // Mostly overhead: the roofline's own verdict says so, or the step moved under half the copy bandwidth.
  const overhead = /overhead/i.test(dv.verdict || '') || bytesPerS / rl.bandwidth_bytes_s < 0.5;
  return {
    ridge: `${formatFixed(pv.ridge, 1)} FLOP/B`,
    prefillTokens: formatInt(prefill.tokens),
    prefillIntensity: `${formatFixed(prefill.intensity, 1)} FLOP/B`,
    prefillSide: pv.side === 'compute-bound' ? 'right of it, on the compute side' : 'left of it, on the memory side',
    prefillShare: pct(pv.share),
    prefillVerdict: pv.verdict || `${pv.side} by position`,
    decodeIntensity: `${formatFixed(decode.intensity, 1)} FLOP/B`,
    decodeBandwidthShare: pct(bytesPerS / rl.bandwidth_bytes_s),
    decodeVerdict: dv.verdict || `${dv.side} by position${overhead ? ', though far below that roof' : ''}`,
    decodeOverhead: overhead,
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
    Object.assign(facts, {
      ridge: [roof.ridge, 'computed'],
      'prefill-tokens': [roof.prefillTokens, 'measured'],
      'prefill-intensity': [roof.prefillIntensity, 'computed'],
      'prefill-side': [roof.prefillSide, 'computed'],
      'prefill-verdict': [roof.prefillVerdict, 'computed'],
      'prefill-share': [roof.prefillShare, 'computed'],
      'decode-bandwidth-share': [roof.decodeBandwidthShare, 'computed'],
      'decode-verdict': [roof.decodeVerdict, 'computed'],
    });
    hidden.push(roof.decodeOverhead ? 'roof-decode-memory' : 'roof-decode-overhead');
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
