// Polls /api/model until the model is ready or failed, and tells the rest of the page via a
// `kvscope:model` event on document (detail = the /api/model JSON).
let timer = null;
let latest = null;

export function currentModel() { return latest; }

export function mount(el) {
  async function poll() {
    try {
      const res = await fetch('/api/model');
      latest = await res.json();
      render(el, latest);
      document.dispatchEvent(new CustomEvent('kvscope:model', { detail: latest }));
      if (latest.status === 'loading') timer = setTimeout(poll, 1000);
    } catch (err) {
      if (el) el.textContent = 'Model: server not reachable.';
      timer = setTimeout(poll, 3000);
    }
  }
  poll();
}

function render(el, info) {
  if (!el) return;
  if (info.status === 'ready') {
    const f = info.facts || {};
    el.textContent = `Model: ${f.name || 'ready'} on ${f.device_name || f.device || '?'} (${f.dtype || '?'}) — ready.`;
  } else if (info.status === 'failed') {
    el.textContent = `Model failed to load: ${info.reason || 'unknown reason'}`;
  } else {
    el.textContent = 'Model: loading… (the page works meanwhile; live runs start when it is ready)';
  }
  el.dataset.status = info.status;
}

export function destroy() { if (timer) clearTimeout(timer); }
