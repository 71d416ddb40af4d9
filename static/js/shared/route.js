// Which weights' route a model, a walkthrough run or the serving recording ran on, by name. Pure.

// The weights' route of a model's facts: the --dtype value that reproduces it (int4, int8, float32, …).
export function routeOf(model) {
  if (!model) return null;
  return model.dtype_route || model.weights_dtype || routeName(model.route) || model.dtype || null;
}

// A route as a recording writes it: a name ("int4"), or the route's facts ({dtype_route, weights_dtype, …}).
export function routeName(route) {
  if (!route) return null;
  if (typeof route === 'string') return route;
  return route.dtype_route || route.weights_dtype || null;
}

// The route the serving chapter's recording ran on: the experiment's own answer (`machine.route`) when
// given, else the recording's field, else the tail of its model line ("SmolLM2-135M-Instruct (Q4_1 GGUF),
// int4" → "int4").
export function servingRoute(serving, response = null) {
  const own = routeName(response && response.machine && response.machine.route);
  if (own) return own;
  const on = (serving && serving.recordedOn) || {};
  const named = routeName(on.route) || on.dtype_route || on.weights_dtype;
  if (named) return named;
  const m = /,\s*([A-Za-z0-9_]+)\s*$/.exec(on.model || '');
  return m ? m[1] : null;
}

// Whether a run kept float32 copies of its weights for prompts (formulas/cost.py Shape.float_prefill, true only
// on int4 where the CPU's kernels want it): a model's cost shape says so, a serving experiment's machine
// (app/experiments.py) too. null when the source does not say.
export function floatPrefillOf(source) {
  if (!source) return null;
  const own = source.float_prefill ?? (source.cost_shape && source.cost_shape.float_prefill);
  return typeof own === 'boolean' ? own : null;
}

// The kernels a prompt and a decode step ran on, or null when both ran the same one (or it is not known):
// only a quantized route that kept float32 copies for prompts (`floatPrefill`) runs a prompt of FLOAT_ROWS
// (16) rows or more on them (model_runner/loading/quantize.py); int8, and int4 without the copies, run every
// call on the route's own kernel, as a decode step always does.
export function kernelsOf(route, promptTokens, floatPrefill) {
  if (route !== 'int4' && route !== 'int8') return null;
  if (floatPrefill !== true || !(promptTokens >= 16)) return null;
  return { prompt: 'float32 GEMM', decode: `${route} kernel` };
}

// The decoder a recording's steps ran on, as its recorder wrote it ("transformers' forward", "the native
// step"): part of every recording's source line, since the two run the same model at different speeds.
export function decoderOf(recordedOn) {
  const d = recordedOn && recordedOn.decoder;
  return typeof d === 'string' && d ? d : 'decoder not recorded';
}
