// "Check the formula on the live model": runs the real model for a bounded number of new tokens and
// sets the cache bytes the engine measured (key/value tensor sizes) beside the server's formula and
// this page's own formula for the same number of positions, after the prefill and after each token.
import { runRequest } from '../ws-client.js';
import { finder, html, labelCells } from '../shared/dom.js';
import { formatInt, plural } from '../shared/format.js';
import { EVENT } from '../shared/protocol.js';
import { bytesNode } from './bytes.js';
import { kvCacheBytes } from './kv-math.js';

const MAX_NEW_TOKENS = 256;
const PROMPT = 'In three sentences, explain why a language model keeps a cache while it writes.';

// A run in flight is cancelled, and the buttons unwired, when the calculator's `figure` is destroyed.
export function createLiveCheck(part, figure) {
  const q = finder(part);
  const input = q('[data-field="liveTokens"]');
  const runBtn = q('[data-action="live-run"]');
  const stopBtn = q('[data-action="live-cancel"]');
  const status = q('[data-out="live-status"]');
  const table = q('[data-out="live-table"]');
  const verdict = q('[data-out="live-verdict"]');
  let facts = null;
  let running = null;

  function setModel(info) {
    facts = info && info.status === 'ready' ? info.facts : null;
    if (running) return;
    runBtn.disabled = !facts;
    if (facts) {
      status.textContent = `Ready: ${facts.name} (${facts.dtype}, ${formatInt(facts.kv_bytes_per_token)} B per cached position).`;
    } else if (info && info.status === 'failed') {
      status.textContent = `The model failed to load (${info.reason || 'no reason given'}), so there is nothing to measure.`;
    } else {
      status.textContent = 'Waiting for the model to be ready…';
    }
  }

  function newTokens() {
    const n = Math.round(Number(input.value));
    const bounded = Number.isFinite(n) ? Math.min(MAX_NEW_TOKENS, Math.max(1, n)) : 16;
    input.value = String(bounded);
    return bounded;
  }

  function run() {
    if (!facts || running) return;
    const arch = { layers: facts.layers, kvHeads: facts.kv_heads, headDim: facts.head_dim, bytesPerElement: facts.bytes_per_element };
    const readings = [];
    const n = newTokens();
    table.hidden = true;
    table.tBodies[0].replaceChildren();
    verdict.textContent = '';
    status.textContent = `Sending a request for up to ${plural(n, 'new token')}…`;

    function onEvent(ev) {
      if (ev.type === EVENT.QUEUED) status.textContent = `Queued: position ${ev.position}.`;
      if (ev.type === EVENT.PREFILL_START) status.textContent = `Prefill: reading ${plural(ev.prompt_tokens, 'prompt token')}…`;
      if (ev.cache_bytes_measured == null) return;
      const reading = {
        moment: ev.type === EVENT.PREFILL_END ? 'after the prefill' : `at token ${ev.index + 1}`,
        tokens: ev.cache_tokens, measured: ev.cache_bytes_measured, server: ev.cache_bytes_formula,
        page: kvCacheBytes(arch, ev.cache_tokens),
      };
      readings.push(reading);
      status.textContent = `Decoding: ${plural(ev.cache_tokens, 'position')} in the cache.`;
      showRows(readings);
    }

    running = runRequest({
      messages: [{ role: 'user', content: PROMPT }], max_new_tokens: n, sampling: { temperature: 0 },
    }, { onEvent });
    runBtn.disabled = true;
    stopBtn.hidden = false;
    running.done.then((end) => {
      running = null;
      if (!figure.alive) return;
      stopBtn.hidden = true;
      runBtn.disabled = !facts;
      status.textContent = endText(end);
      verdict.textContent = judge(readings);
      verdict.dataset.match = String(readings.length > 0 && readings.every(agrees));
    });
  }

  function showRows(readings) {
    const first = readings[0];
    const last = readings[readings.length - 1];
    const rows = readings.length > 1 ? [first, last] : [first];
    table.tBodies[0].replaceChildren(...rows.map((r) => {
      const tr = html('tr');
      const th = html('th', { text: r.moment });
      th.scope = 'row';
      tr.append(th, html('td', { text: formatInt(r.tokens) }));
      for (const [key, value] of [['measured', r.measured], ['server', r.server], ['page', r.page]]) {
        const td = html('td');
        td.dataset.col = key;
        td.append(bytesNode(value));
        tr.append(td);
      }
      return labelCells(table, tr);
    }));
    table.hidden = false;
  }

  function stop() {
    if (running) running.cancel();
  }

  figure.listen(runBtn, 'click', run);
  figure.listen(stopBtn, 'click', stop);
  figure.onDestroy(stop);

  return { setModel };
}

function agrees(r) {
  return r.measured === r.server && r.measured === r.page;
}

function endText(end) {
  if (end.type === EVENT.FINISHED) {
    const why = { eos: 'the model ended its answer', max_tokens: 'it reached the token limit' }[end.reason] || end.reason;
    return `Finished after ${plural(end.tokens, 'token')}: ${why}.`;
  }
  if (end.type === EVENT.CANCELLED) return `Stopped after ${plural(end.tokens, 'token')}.`;
  return `The run failed: ${end.message || end.code}.`;
}

function judge(readings) {
  if (!readings.length) return 'No cache readings arrived, so there is nothing to compare.';
  const first = readings[0].tokens;
  const last = readings[readings.length - 1].tokens;
  const off = readings.filter((r) => !agrees(r));
  if (!off.length) {
    return `Measured equals the formula at all ${formatInt(readings.length)} readings, from `
      + `${formatInt(first)} to ${plural(last, 'cached position')}.`;
  }
  const r = off[0];
  return `Measured and formula differ at ${formatInt(off.length)} of ${formatInt(readings.length)} readings. `
    + `First at ${plural(r.tokens, 'position')}: measured ${formatInt(r.measured)} B, server's formula `
    + `${formatInt(r.server)} B, this page's formula ${formatInt(r.page)} B.`;
}
