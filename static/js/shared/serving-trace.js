// The serving chapter's recorded trace (static/data/serving-trace.json, written by
// scripts/record_serving_trace.py), loaded once for whichever page part needs it.

export const TRACE_URL = new URL('../../data/serving-trace.json', import.meta.url);

// The trace's experiments by name, with what it says about where it was recorded; null if absent.
export async function loadTrace(signal) {
  const res = await fetch(TRACE_URL, { signal });
  if (res.status === 404) return null;
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  const trace = await res.json();
  if (!trace || trace.schema !== 1 || typeof trace.experiments !== 'object' || !trace.experiments) {
    throw new Error('not a serving trace (schema 1)');
  }
  return { recordedOn: trace.recorded_on || {}, experiments: trace.experiments };
}
