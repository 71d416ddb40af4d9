// A lab run as a kvscope trace (static/js/trace.js, the format the walkthrough replays) and a trace
// back into a run the history can show. No DOM.
import { makeTrace, parseTrace, serializeTrace } from '../trace.js';
import { createRun, applyEvent } from './run-state.js';

export { parseTrace, serializeTrace };

// A run whose prompt could not be described (a rejected request, say) still exports: no tokens.
const NO_PROMPT = { rendered: '', tokens: [], counts: { content: 0, template: 0, total: 0 }, budget: null };

// The trace ends at the terminal event, as the format requires. A dropped connection ends it with
// the browser's own `connection_lost` error, the same way the walkthrough records one; both that
// and any events that came after the terminal one are said in the trace's note.
export function traceOfRun(run, model, recordedAt = new Date()) {
  const end = run.terminal ? run.events.indexOf(run.terminal) + 1 : run.events.length;
  const events = run.events.slice(0, end);
  const notes = [];
  if (run.clientError) {
    const last = events[events.length - 1];
    events.push({ ...run.clientError, t_ms: last ? last.t_ms : 0 });
    notes.push('The connection dropped before the server ended the request; the last event was added by the browser.');
  }
  if (run.afterTerminal) notes.push(`${run.afterTerminal} events that arrived after the terminal event are left out.`);
  return makeTrace({
    model,
    request: { ...run.payload, request_id: run.requestId },
    prompt: run.prompt || NO_PROMPT,
    events,
    recordedAt: recordedAt.toISOString(),
    note: notes.join(' ') || undefined,
  });
}

// Folds a parsed trace's events into a run. A trace holds no browser receipt times, so the
// server's t_ms stand in for them.
export function runFromTrace(trace, id) {
  const run = createRun({ id, kind: 'imported', label: trace.recorded_at || '', payload: trace.request });
  run.sentAt = 0;
  run.prompt = trace.prompt;
  run.requestId = trace.request.request_id ?? trace.events[0]?.request_id ?? null;
  for (const e of trace.events) applyEvent(run, e, e.t_ms);
  return run;
}
