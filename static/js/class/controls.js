// The teacher's controls (the template renders them only for the teacher): pause/resume admissions,
// cancel everything, the per-laptop cap and rate limit, "show prompts", the engine's policies and its
// batch-invariant mode, each POSTed to the class API; the answer (or the server's error, naming the
// field and the limit) shows in the status line, and the inputs follow the state the feed reports.
import { defineFigure } from '../shared/figure.js';
import { finder } from '../shared/dom.js';
import { followState } from './feed.js';

async function post(path, body, signal) {
  const res = await fetch(path, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body ?? {}), signal,
  });
  let data = null;
  try { data = await res.json(); } catch { /* an empty or non-JSON answer */ }
  if (!res.ok) throw new Error(data?.error?.message || data?.message || `HTTP ${res.status}`);
  return data;
}

// Why the batch-invariant toggle cannot be pressed now ('' when it can), from the engine's report of
// the mode and its policy: a remote engine has no such mode, and the mode keeps prefix caching off.
export function modeBlocker(mode, policy) {
  if (mode?.why_unavailable) return `Not available: ${mode.why_unavailable}.`;
  if (mode && !mode.on && policy?.prefix_caching) {
    return 'Turn prefix caching off first: the mode keeps it off (a shared prefix holds other bits).';
  }
  return '';
}

// A number field's value: an integer, null when empty (only where `emptyIsNull`), or an Error.
function readInt(input, emptyIsNull) {
  const raw = input.value.trim();
  if (raw === '' && emptyIsNull) return null;
  const n = Number(raw);
  return Number.isInteger(n) ? n : new Error(`${input.dataset.name} must be a whole number`);
}

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const dom = {
    status: q('[data-control-status]'), pause: q('[data-control="pause"]'), cancel: q('[data-control="cancel-all"]'),
    cap: q('[data-control="per_laptop_cap"]'), rate: q('[data-control="rate_per_min"]'),
    prompts: q('[data-control="show_prompts"]'), batching: q('[data-control="batching"]'),
    chunked: q('[data-control="chunked_prefill"]'), prefix: q('[data-control="prefix_caching"]'),
    seqs: q('[data-control="max_num_seqs"]'), limits: q('form[data-form="limits"]'), policy: q('form[data-form="policy"]'),
    mode: q('[data-control="batch_invariant"]'), modeReason: q('[data-mode-reason]'),
  };
  const dirty = new Set(); // inputs edited and not yet applied: the feed must not overwrite them
  let paused = false;
  let fed = null; // the feed's last state
  let answered = null; // the mode as the last switch answered it, until the feed reports the same
  let switching = false; // a switch is on its way: a second press waits (the button keeps its focus)

  function say(text, ok = true) {
    dom.status.textContent = text;
    dom.status.dataset.ok = String(ok);
  }

  async function send(path, body, done) {
    try {
      await post(path, body, figure.signal);
      say(done);
      return true;
    } catch (err) {
      if (figure.alive) say(`Not applied: ${err.message}`, false);
      return false;
    }
  }

  function settings(body, done) {
    return send('/api/class/settings', body, done);
  }

  function policy(body, done) {
    return send('/api/class/policy', body, done);
  }

  const { listen } = figure;
  listen(dom.pause, 'click', () => settings({ paused: !paused }, paused ? 'Admissions resumed.' : 'Admissions paused.'));
  listen(dom.cancel, 'click', () => send('/api/class/cancel-all', {}, 'Every queued and running request was cancelled.'));
  listen(dom.prompts, 'change', () => settings({ show_prompts: dom.prompts.checked },
    dom.prompts.checked ? 'Prompts of new requests now show here.' : 'Prompts are hidden again.'));
  for (const input of [dom.cap, dom.rate, dom.seqs]) listen(input, 'input', () => dirty.add(input));
  listen(dom.limits, 'submit', async (e) => {
    e.preventDefault();
    const cap = readInt(dom.cap, false);
    const rate = readInt(dom.rate, true);
    const bad = [cap, rate].find((v) => v instanceof Error);
    if (bad) { say(`Not applied: ${bad.message}`, false); return; }
    if (await settings({ per_laptop_cap: cap, rate_per_min: rate }, 'Limits applied.')) {
      dirty.delete(dom.cap);
      dirty.delete(dom.rate);
    }
  });
  listen(dom.batching, 'change', () => policy({ batching: dom.batching.value }, `Batching: ${dom.batching.value}.`));
  // A box the engine refused (prefix caching in batch-invariant mode, say) goes back to what is in force.
  for (const [box, name, label] of [[dom.chunked, 'chunked_prefill', 'Chunked prefill'],
    [dom.prefix, 'prefix_caching', 'Prefix caching']]) {
    listen(box, 'change', async () => {
      const on = box.checked;
      if (!(await policy({ [name]: on }, `${label} ${on ? 'on' : 'off'}.`)) && figure.alive) box.checked = !on;
    });
  }
  listen(dom.policy, 'submit', async (e) => {
    e.preventDefault();
    const seqs = readInt(dom.seqs, false);
    if (seqs instanceof Error) { say(`Not applied: ${seqs.message}`, false); return; }
    if (await policy({ max_num_seqs: seqs }, `Max batch size: ${seqs}.`)) dirty.delete(dom.seqs);
  });

  // The mode now: the switch's own answer until the feed catches up with it, then the feed's.
  function currentMode() {
    const reported = fed?.batchInvariant ?? null;
    if (answered && reported && !!reported.on === !!answered.on) answered = null;
    return answered ?? reported;
  }

  function renderMode() {
    const mode = currentMode();
    const blocker = modeBlocker(mode, fed?.policy);
    dom.mode.setAttribute('aria-pressed', String(!!mode?.on));
    dom.mode.disabled = !mode || blocker !== '';
    dom.modeReason.textContent = blocker;
  }

  listen(dom.mode, 'click', async () => {
    const mode = currentMode();
    if (switching || !mode) return;
    const on = !mode.on;
    switching = true;
    try {
      answered = (await post('/api/class/batch-invariant', { on }, figure.signal)).batch_invariant;
      say(`Batch-invariant mode ${on ? 'on' : 'off'}.`);
    } catch (err) {
      if (figure.alive) say(`Not applied: ${err.message}`, false);
    } finally {
      switching = false;
    }
    if (figure.alive) renderMode();
  });

  const sync = (input, value, prop = 'value') => {
    if (value === undefined || dirty.has(input) || document.activeElement === input) return;
    input[prop] = prop === 'value' ? (value == null ? '' : String(value)) : value;
  };

  followState(figure, (state) => {
    fed = state;
    renderMode();
    const s = state.settings;
    if (s) {
      paused = !!s.paused;
      dom.pause.textContent = paused ? 'Resume admissions' : 'Pause admissions';
      dom.pause.setAttribute('aria-pressed', String(paused));
      sync(dom.prompts, !!s.show_prompts, 'checked');
      sync(dom.cap, s.per_laptop_cap);
      sync(dom.rate, s.rate_per_min);
      el.dataset.paused = String(paused);
    }
    const p = state.policy;
    if (p) {
      sync(dom.batching, p.batching);
      sync(dom.chunked, !!p.chunked_prefill, 'checked');
      sync(dom.prefix, !!p.prefix_caching, 'checked');
      sync(dom.seqs, p.max_num_seqs);
    }
  });
});
