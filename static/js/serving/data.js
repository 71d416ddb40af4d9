// Where the chapter's numbers come from: the recorded trace (static/data/serving-trace.json, written
// by scripts/record_serving_trace.py on the real model) and live runs (POST /api/experiments/<name>).
// Nothing here invents a number: a missing trace yields no data, and the page then offers live runs only.

// GET /api/experiments → {busy, available: {name: {available, why}}}; null if the server has none.
export async function listExperiments(signal) {
  const res = await fetch('/api/experiments', { signal });
  if (!res.ok) return null;
  const body = await res.json();
  const available = {};
  for (const e of body.experiments || []) available[e.name] = { available: !!e.available, why: e.why_unavailable };
  return { busy: !!body.busy, available };
}

// The app's error bodies are {"code","message","field"} (app/api.py); the contract also allows
// {"error": {...}}: both read the same here.
function errorOf(body, status) {
  const err = (body && (body.error || body)) || {};
  return { code: err.code || `http_${status}`, message: err.message || `The server answered ${status}.`, field: err.field };
}

// POST /api/experiments/<name> → {ok: true, response} or {ok: false, error: {code, message, field}}.
export async function runExperiment(name, params, signal) {
  let res;
  try {
    res = await fetch(`/api/experiments/${encodeURIComponent(name)}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(params || {}), signal,
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    return { ok: false, error: { code: 'unreachable', message: 'The server did not answer.' } };
  }
  let body = null;
  try { body = await res.json(); } catch { /* reported below */ }
  if (res.ok && body && body.result) return { ok: true, response: body };
  return { ok: false, error: errorOf(body, res.status) };
}
