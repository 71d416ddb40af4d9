// Polls /api/model until the model is ready or failed, says so in the header's status line and in
// every [data-model-name] slot (the footer names the model actually loaded, not a fixed one), and
// tells the rest of the page via a `kvscope:model` event on document (detail = the /api/model JSON).
// The status line says what runs: the weights' dtype (int8 when quantized), the activations' and
// KV cache's dtype, and why that route was chosen (e.g. `auto` on a CPU with AVX-512).
import { defineFigure } from './shared/figure.js';

let latest = null;

export function currentModel() { return latest; }

export const { mount, destroy } = defineFigure((el, figure) => {
  async function poll() {
    try {
      const res = await fetch('/api/model', { signal: figure.signal });
      latest = await res.json();
      render(el, latest);
      document.dispatchEvent(new CustomEvent('kvscope:model', { detail: latest }));
      if (latest.status === 'loading') figure.timeout(poll, 1000);
    } catch (err) {
      if (!figure.alive) return; // destroyed: the fetch was aborted on purpose
      if (el) el.textContent = 'Model: server not reachable.';
      figure.timeout(poll, 3000);
    }
  }
  poll();
});

function render(el, info) {
  const f = info.facts || {};
  for (const slot of document.querySelectorAll('[data-model-name]')) {
    slot.textContent = info.status === 'ready' ? f.name || 'an unnamed model'
      : info.status === 'failed' ? 'no model (it failed to load)' : 'a model that is still loading';
  }
  if (!el) return;
  if (info.status === 'ready') {
    el.textContent = `Model: ${f.name || 'ready'} on ${f.device_name || f.device || '?'} (${whatRuns(f)}) — ready.`;
    el.title = f.quantization && f.quantization !== 'none' ? f.quantization : '';
  } else if (info.status === 'failed') {
    el.textContent = `Model failed to load: ${info.reason || 'unknown reason'}`;
  } else {
    el.textContent = 'Model: loading… (the page works meanwhile; live runs start when it is ready)';
  }
  el.dataset.status = info.status;
}

// "int8 weights, float32 activations and KV cache; auto on a CPU with AVX512: …" from the /api/model facts;
// servers older than the dtype routes send only `dtype`.
export function whatRuns(f) {
  const kv = f.kv_dtype || f.dtype || '?';
  const weights = f.weights_dtype || f.dtype || '?';
  const line = weights === kv ? `${kv} weights, activations and KV cache` : `${weights} weights, ${kv} activations and KV cache`;
  return f.dtype_reason ? `${line}; ${f.dtype_reason}` : line;
}
