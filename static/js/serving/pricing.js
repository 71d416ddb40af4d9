// Stage 9 figure: token passes without vs with the KV cache for a prompt and reply length the reader
// sets (computed by math.js), the context budget of the reference text's example (computed from its
// cited inputs), and the measured "pricing" experiment: prefill vs decode time per token.
import { html } from '../shared/dom.js';
import { formatFixed, formatInt } from '../shared/format.js';
import { barRow, clear, setting, value } from './view.js';
import { PASS_LIMITS, checkCount, contextUse, share, tokenPasses } from './math.js';
import { floatPrefillOf, kernelsOf, routeName } from '../shared/route.js';

// The reference text's worked budget (“Take one chat request through the autoregressive loop”).
const BUDGET = { content: 1000, template: 38, maxNew: 200, window: 4096 };

function numberField(parent, { id, label, field, initial }) {
  const wrap = html('label', { cls: 'sv-field', parent });
  wrap.htmlFor = id;
  const [lo, hi] = PASS_LIMITS[field];
  html('span', { text: `${label} (${lo}–${hi.toLocaleString('en-US')})`, parent: wrap });
  const input = html('input', { parent: wrap });
  Object.assign(input, { id, type: 'number', min: lo, max: hi, step: 1, value: String(initial), inputMode: 'numeric' });
  input.dataset.field = field;
  return input;
}

function passes(parent, ids) {
  const box = html('div', { cls: 'sv-calc', parent });
  html('p', { cls: 'sv-sub', text: 'Token passes: without a cache vs with one', parent: box });
  const fields = html('div', { cls: 'sv-fields', parent: box });
  const prompt = numberField(fields, { id: ids.prompt, label: 'Prompt tokens', field: 'prompt', initial: 1000 });
  const reply = numberField(fields, { id: ids.reply, label: 'Reply tokens', field: 'reply', initial: 500 });
  const error = html('p', { cls: 'sv-error', parent: box });
  error.setAttribute('role', 'alert');
  const out = html('div', { cls: 'sv-bars sv-pass-bars', parent: box });
  out.setAttribute('aria-live', 'polite');
  const draw = () => {
    const p = Number(prompt.value);
    const r = Number(reply.value);
    const problem = checkCount('prompt', p) || checkCount('reply', r);
    error.textContent = problem || '';
    prompt.setAttribute('aria-invalid', String(!!checkCount('prompt', p)));
    reply.setAttribute('aria-invalid', String(!!checkCount('reply', r)));
    out.replaceChildren();
    if (problem) return;
    const t = tokenPasses(p, r);
    barRow(out, { label: 'no cache', fraction: 1, text: formatInt(t.noCache), cls: 'sv-nocache', provenance: 'computed',
      data: { value: t.noCache } });
    barRow(out, { label: 'KV cache', fraction: share(t.withCache, [t.noCache]), text: formatInt(t.withCache),
      cls: 'sv-withcache', provenance: 'computed', data: { value: t.withCache } });
    const note = html('p', { cls: 'sv-note', parent: out });
    // Rounded down, as the reference text's own code prints it (625,250 // 1,500 = 416, not 417).
    note.append('Without the cache: ');
    value(note, `${formatInt(Math.floor(t.ratio))} times`, 'computed', 'sv-num sv-ratio');
    note.append(' the passes (');
    value(note, formatFixed(t.ratio, 1), 'computed');
    note.append(', rounded down) ');
    html('span', { cls: 'tag tag-computed', text: 'computed', parent: note });
  };
  return { inputs: [prompt, reply], draw };
}

function budget(parent) {
  const u = contextUse(BUDGET);
  const p = html('p', { cls: 'sv-note sv-budget', parent });
  value(p, formatInt(BUDGET.content), 'cited');
  p.append(' content + ');
  value(p, formatInt(BUDGET.template), 'cited');
  p.append(' template tokens + up to ');
  value(p, formatInt(BUDGET.maxNew), 'cited');
  p.append(' new ones = ');
  value(p, `${formatInt(u.used)} of ${formatInt(u.window)}`, 'computed', 'sv-num sv-budget-used');
  p.append(' positions of the context window ');
  html('span', { cls: 'tag tag-computed', text: 'computed', parent: p });
}

function pricing(parent, response) {
  parent.replaceChildren();
  html('p', { cls: 'sv-sub', text: 'Prompt token vs new token: time per token on the machine named above, batch one', parent });
  if (!response) {
    html('p', { cls: 'sv-empty', text: 'No recorded pricing run. Press “Run it for real” to measure it here.', parent });
    return;
  }
  const r = response.result;
  const both = [r.prefill_ms_per_token, r.decode_ms_per_token];
  // the prefill's measured time over its prompt tokens: a division, so computed; the decode figure is a measured step
  barRow(parent, { label: 'prefill / token', fraction: share(r.prefill_ms_per_token, both),
    text: `${formatFixed(r.prefill_ms_per_token, 2)} ms`, cls: 'sv-prefill', provenance: 'computed',
    data: { value: r.prefill_ms_per_token } });
  barRow(parent, { label: 'decode / token', fraction: share(r.decode_ms_per_token, both),
    text: `${formatFixed(r.decode_ms_per_token, 2)} ms`, cls: 'sv-decode', data: { value: r.decode_ms_per_token } });
  const note = html('p', { cls: 'sv-note', parent });
  note.append('One new token took ');
  value(note, `${formatFixed(r.ratio, 1)} times`, 'computed', 'sv-num sv-price-ratio');
  note.append(' as long as one prompt token (');
  value(note, `${formatInt(r.prompt_tokens)}-token prompt`, 'measured'); // the tokenized count
  note.append(', ');
  setting(note, `${formatInt(r.new_tokens)} new tokens`); // the experiment's own parameter
  note.append('), one request at a time on the machine named above. That shows why the asymmetry exists; it is not a price'
    + ' ratio, which also depends on batching, hardware and business.');
  // int4 with float32 copies for prompts runs a long prompt and a decode step on different kernels: the ratio
  // sets one beside the other (the machine's float_prefill says; int8 runs both on its own kernel)
  const machine = response.machine || {};
  const kernels = kernelsOf(routeName(machine.route), r.prompt_tokens, floatPrefillOf(machine));
  if (kernels && kernels.prompt !== kernels.decode) {
    note.append(` The prompt ran on the ${kernels.prompt}, each new token on the ${kernels.decode}, so this compares two`
      + ' kernels.');
  }
}

export function mount(el) {
  clear(el);
  const calc = passes(el, { prompt: 'sv-pass-prompt', reply: 'sv-pass-reply' });
  for (const input of calc.inputs) input.addEventListener('input', calc.draw);
  calc.draw();
  budget(el);
  const price = html('div', { cls: 'sv-pricing sv-bars', parent: el });
  pricing(price, null);
  return {
    show(response) { pricing(price, response); }, // null: no pricing run to show yet
    clear() { pricing(price, null); },
    destroy() {
      for (const input of calc.inputs) input.removeEventListener('input', calc.draw);
      clear(el);
    },
  };
}
