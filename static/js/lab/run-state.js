// One run's state, folded from its events (no DOM): status, tokens, text, whether the answer is
// complete, and the browser's own receipt times. A run is complete only on `finished`; `cancelled`,
// `error` and a lost connection leave it incomplete, and events after the terminal one are counted,
// never applied.
import { plural } from '../shared/format.js';
import { EVENT, isConnectionLost, isTerminal } from '../shared/protocol.js';

export function createRun({ id, kind, label, payload }) {
  return {
    id, kind, label, payload,
    requestId: null,
    status: 'connecting',
    events: [], // server events, in arrival order
    received: [], // browser receipt time (performance.now()) of each server event
    sentAt: null,
    tokens: [],
    text: '',
    budget: null,
    queue: null, // latest {position, ahead}
    queuedSeen: [], // every queued event, to show that it waited
    chunk: null, // latest prefill_chunk {start, end} when the prompt is prefilled in chunks
    complete: false,
    terminal: null,
    clientError: null, // a failure the browser saw itself (the connection dropped)
    afterTerminal: 0,
    prompt: null, // the /api/prompt description of this payload, for export
    firstTextAt: null, // browser receipt time of the first visible text
    terminalAt: null,
  };
}

// A dropped socket arrives as ws-client's synthetic event (isConnectionLost): it ends the run as
// `connection_lost` but is not one of the server's events.
export function applyEvent(run, event, clientMs) {
  if (isConnectionLost(event)) {
    if (!run.terminal && !run.clientError) {
      run.clientError = event;
      run.status = 'connection_lost';
      run.terminalAt = clientMs;
    }
    return run;
  }
  run.events.push(event);
  run.received.push(clientMs);
  if (run.terminal || run.clientError) {
    run.afterTerminal += 1;
    return run;
  }
  APPLY[event.type]?.(run, event, clientMs);
  if (isTerminal(event.type)) {
    run.terminal = event;
    run.terminalAt = clientMs;
    if (run.firstTextAt == null && event.text) run.firstTextAt = clientMs;
  }
  return run;
}

// What each event type changes in the run. (`run.status` values are the run's own states; several
// share an event's name, others, like 'prefill' and 'connection_lost', do not.)
const APPLY = {
  [EVENT.ACCEPTED](run, e) { run.status = 'accepted'; run.budget = e.budget; },
  [EVENT.QUEUED](run, e) {
    run.status = 'queued';
    run.queue = { position: e.position, ahead: e.ahead };
    run.queuedSeen.push({ position: e.position, ahead: e.ahead, t_ms: e.t_ms });
  },
  [EVENT.PREFILL_START](run) { run.status = 'prefill'; },
  [EVENT.PREFILL_CHUNK](run, e) { run.chunk = { start: e.start, end: e.end }; },
  [EVENT.PREFILL_END](run) { run.status = 'decode'; },
  [EVENT.TOKEN](run, e, clientMs) {
    run.status = 'decode';
    run.tokens.push({
      index: e.index, id: e.id, text: e.text, pending: e.pending, prob: e.prob,
      candidates: e.candidates || [], stepMs: e.step_ms, mask: e.mask ?? null,
    });
    run.text += e.text;
    if (e.text && run.firstTextAt == null) run.firstTextAt = clientMs;
  },
  [EVENT.FINISHED](run, e) { run.status = 'finished'; run.complete = true; run.text = e.text; },
  [EVENT.CANCELLED](run, e) { run.status = 'cancelled'; run.complete = false; run.text = e.text; },
  [EVENT.ERROR](run) { run.status = 'error'; run.complete = false; },
};

const FINISH_REASONS = {
  eos: 'the model ended its answer',
  max_tokens: 'it reached the max-new-tokens limit, so the answer may be cut short',
  stop_string: 'a stop string appeared (it is not included in the text)',
  context_full: 'the context window is full, so the answer may be cut short',
  timeout: 'the server time limit ran out, so the answer may be cut short',
};

const CANCEL_CAUSES = {
  client: 'you pressed Stop',
  disconnect: 'the connection closed',
  slow_client: 'the browser stopped reading fast enough',
  shutdown: 'the server shut down',
};

// One sentence saying where the run is, or how it ended.
export function describeStatus(run) {
  const t = run.terminal;
  switch (run.status) {
    case 'connecting': return 'Connecting…';
    case 'accepted': return `Accepted: ${plural(run.budget?.prompt_tokens ?? 0, 'prompt token')}.`;
    case 'queued': return `Queued: position ${run.queue.position}, ${plural(run.queue.ahead, 'request')} ahead.`;
    case 'prefill':
      return run.chunk
        ? `Prefill in chunks: tokens ${run.chunk.start}–${run.chunk.end} of ${run.budget?.prompt_tokens ?? '?'} are in the cache…`
        : 'Prefill: reading the prompt…';
    case 'decode': return `Decoding: ${plural(run.tokens.length, 'token')} so far…`;
    case 'finished': return `Finished after ${plural(t.tokens, 'token')}: ${FINISH_REASONS[t.reason] || t.reason}.`;
    case 'cancelled':
      return `Did not finish: cancelled during ${t.state} after ${plural(t.tokens, 'token')} `
        + `(${CANCEL_CAUSES[t.cause] || t.cause}). The text is partial.`;
    case 'error': return `Failed (${t.code}${t.field ? `, field ${t.field}` : ''}): ${t.message}`;
    case 'connection_lost':
      return `Connection lost after ${plural(run.tokens.length, 'token')}: the answer did not finish. `
        + `${run.clientError.message} Nothing was retried.`;
    default: return run.status;
  }
}

export function isDone(run) { return Boolean(run.terminal || run.clientError); }
