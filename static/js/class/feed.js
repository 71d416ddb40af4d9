// The class view's connection: mount(el) subscribes to the engine feed over /ws (ws or wss as the page
// was served), folds every event into one state with feed-state.js, and at most once a frame tells
// the figures with a `kvscope:class-state` event on document (detail = the state). el shows the
// connection's status. A closed socket is reopened after a pause, from a fresh state.
import { defineFigure } from '../shared/figure.js';
import { wsUrl } from '../ws-client.js';
import { FEED } from '../shared/protocol.js';
import { applyEvent, createClassState } from './feed-state.js';

const RETRY_MS = 2000;
const MODE_ASK_MS = 1000; // at most one question a second about the mode's kernel check
export const STATE_EVENT = 'kvscope:class-state';

let current = null; // the mounted feed's state, for controls that read the latest settings

export function classState() { return current; }

// Calls render(state) now (if the feed is mounted) and on every change, for as long as `figure` lives.
export function followState(figure, render) {
  figure.listen(document, STATE_EVENT, (e) => render(e.detail));
  if (current) render(current);
}

export const { mount, destroy } = defineFigure((el, figure) => {
  let socket = null;
  let pending = 0;
  let state = createClassState();
  current = state;
  let askedModeAt = -Infinity;

  function say(status, text) {
    el.dataset.status = status;
    el.textContent = text;
  }

  function publish() {
    pending = 0;
    document.dispatchEvent(new CustomEvent(STATE_EVENT, { detail: state }));
  }

  function changed() {
    if (!pending) pending = figure.frame(publish);
  }

  function apply(event) {
    applyEvent(state, event);
    changed();
  }

  // The class settings, the number of laptops and the engine's batch-invariant mode, before the feed's
  // first class_state (which carries the mode only when the teacher switches it).
  async function loadClass() {
    try {
      const res = await fetch('/api/class', { signal: figure.signal });
      if (!res.ok) return;
      const info = await res.json();
      apply({ type: 'class_state', laptops: info.laptops, settings: info.settings,
        batch_invariant: info.batch_invariant });
      if (info.policy) apply({ type: 'engine_policy', policy: info.policy });
    } catch { /* the feed's class_state says the same once it comes */ }
  }

  // The engine checks the mode's kernels as its next step starts (model_runner/local/step/invariant.py): a
  // mode switched on before that says nothing of its claim, so the first step after it asks again.
  async function refreshMode() {
    askedModeAt = performance.now();
    try {
      const res = await fetch('/api/class', { signal: figure.signal });
      if (res.ok) apply({ type: 'class_state', batch_invariant: (await res.json()).batch_invariant });
    } catch { /* a later step asks again */ }
  }

  function connect() {
    state = createClassState();
    current = state;
    say('connecting', 'Connecting to the engine feed…');
    socket = new WebSocket(wsUrl());
    figure.listen(socket, 'open', () => {
      socket.send(JSON.stringify({ type: 'subscribe' }));
      say('open', 'Live: following the engine feed.');
      loadClass();
    });
    figure.listen(socket, 'message', (msg) => {
      let event;
      try { event = JSON.parse(msg.data); } catch { return; }
      apply(event);
      const mode = state.batchInvariant;
      const unchecked = mode?.on && mode.claimed == null;
      if (event?.type === FEED.ENGINE_STEP && unchecked && performance.now() - askedModeAt > MODE_ASK_MS) refreshMode();
    });
    figure.listen(socket, 'close', () => {
      say('closed', `The engine feed closed; reconnecting in ${RETRY_MS / 1000} s…`);
      figure.timeout(connect, RETRY_MS);
    });
    changed();
  }

  figure.onDestroy(() => {
    current = null;
    if (socket && socket.readyState <= WebSocket.OPEN) socket.close(1000);
  });
  connect();
});
