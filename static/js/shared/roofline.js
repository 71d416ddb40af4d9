// The roofline's arithmetic, shared by the walkthrough and the serving chapter: the roof above a
// point, the ridge where the two limits meet, and a measured point's side and share. Pure, no DOM.
import { attainableFlopsS } from './cost.js';

// The roof a point sits under (shared/cost.js, the twin of model_runner/cost.py attainable_flops_s, which
// the server's points carry as attainable_flops_s): bandwidth-limited left of the ridge, compute-limited right.
export function roof(intensity, { peak_flops_s: peak, bandwidth_bytes_s: bw }) {
  return attainableFlopsS(intensity, peak, bw);
}

export function ridge({ peak_flops_s: peak, bandwidth_bytes_s: bw }) {
  return peak / bw;
}

// A point's verdict and share: the roofline's own fields when the recording has them, else worked out
// here from its position (left of the ridge: memory side; right: compute side) and its roof.
export function pointVerdict(point, roofline) {
  const attainable = Number.isFinite(point.attainable_flops_s) ? point.attainable_flops_s : roof(point.intensity, roofline);
  const share = Number.isFinite(point.share) ? point.share : point.flops_s / attainable;
  const ridgeAt = Number.isFinite(roofline.ridge_intensity) ? roofline.ridge_intensity : ridge(roofline);
  const side = point.intensity >= ridgeAt ? 'compute-bound' : 'memory-bound';
  return { share, attainable, side, verdict: point.verdict || null, ridge: ridgeAt };
}

// The kernel the roof's peak was timed on, in words ("float32 GEMM", "int8 kernel", "bfloat16 GEMM"): the
// recording's peak_kernel up to " on this model's layers" (serving_experiments/roofline.py), else the kernel
// its prefill point ran, else null. Read from the recording, never assumed from the route.
export function roofKernel(roofline) {
  const named = roofline && typeof roofline.peak_kernel === 'string' ? roofline.peak_kernel.split(' on ')[0].trim() : '';
  if (named) return named;
  const prefill = ((roofline && roofline.points) || []).find((p) => p.phase === 'prefill');
  return (prefill && prefill.kernel) || null;
}
