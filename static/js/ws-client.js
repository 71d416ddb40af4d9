// One WebSocket request against /ws: send `generate`, hand every event to onEvent, settle on the
// terminal event. ws/wss follows the page's own protocol. Nothing here retries on its own.
import { CONNECTION_LOST, EVENT, isTerminal } from './shared/protocol.js';

let counter = 0;

export function wsUrl(path = '/ws') {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${scheme}//${location.host}${path}`;
}

export function newRequestId(prefix = 'r') {
  counter += 1;
  return `${prefix}-${Date.now().toString(36)}-${counter}`;
}

// Opens a socket, runs one request, closes. Returns {requestId, cancel(), done}. `done` resolves
// with the terminal event; a dropped connection resolves with a synthetic
// {type: 'error', code: CONNECTION_LOST} (and no `schema`) so the caller can say what happened.
export function runRequest(payload, { onEvent = () => {}, onOpen = () => {} } = {}) {
  const requestId = payload.request_id || newRequestId();
  const socket = new WebSocket(wsUrl());
  let settled = false;
  let resolveDone;
  const done = new Promise((resolve) => { resolveDone = resolve; });

  function settle(event) {
    if (settled) return;
    settled = true;
    resolveDone(event);
    if (socket.readyState === WebSocket.OPEN) socket.close(1000);
  }

  socket.addEventListener('open', () => {
    socket.send(JSON.stringify({ ...payload, type: 'generate', request_id: requestId }));
    onOpen(requestId);
  });
  socket.addEventListener('message', (msg) => {
    let event;
    try { event = JSON.parse(msg.data); } catch { return; }
    if (event.request_id !== requestId && event.request_id != null) return;
    onEvent(event);
    if (isTerminal(event.type)) settle(event);
  });
  socket.addEventListener('close', (ev) => {
    settle({ type: EVENT.ERROR, code: CONNECTION_LOST, request_id: requestId,
             message: `The connection closed before the answer ended (code ${ev.code}).` });
  });

  function cancel() {
    if (!settled && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: 'cancel', request_id: requestId }));
    }
  }
  return { requestId, cancel, done };
}
