// The lab's two HTTP calls: POST /api/prompt (what the model will read, and the budget decision)
// and GET /api/model (the facts the estimates use). Each returns {ok, data} or {ok: false, error}.

export async function describePrompt(payload, signal) {
  let res;
  try {
    res = await fetch('/api/prompt', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(payload), signal,
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    return { ok: false, error: { code: 'unreachable', message: 'The server did not answer.' } };
  }
  let body = null;
  try { body = await res.json(); } catch { /* a non-JSON answer is reported below */ }
  if (res.ok && body) return { ok: true, data: body };
  return { ok: false, error: body || { code: `http_${res.status}`, message: `The server answered ${res.status}.` } };
}

export async function fetchModel() {
  try {
    const res = await fetch('/api/model');
    return { ok: res.ok, data: await res.json() };
  } catch {
    return { ok: false, error: { code: 'unreachable', message: 'The server did not answer.' } };
  }
}
