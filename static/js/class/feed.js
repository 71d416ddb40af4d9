// The class view's connection: mount(el) subscribes to the engine feed over /ws (ws or wss as the page
// was served), folds every event into one state with feed-state.js, and at most once a frame tells
// the figures with a `kvscope:class-state` event on document (detail = the state). el shows the
// connection's status. A closed socket is reopened after a pause, from a fresh state.
import { defineFigure } from '../shared/figure.js';
import { wsUrl } from '../ws-client.js';
import { applyEvent, createClassState } from './feed-state.js';

const RETRY_MS = 2000;
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

  // The class settings and the number of laptops, before the first class_state arrives on the feed.
  async function loadClass() {
    try {
      const res = await fetch('/api/class', { signal: figure.signal });
      if (!res.ok) return;
      const info = await res.json();
      apply({ type: 'class_state', laptops: info.laptops, settings: info.settings });
      if (info.policy) apply({ type: 'engine_policy', policy: info.policy });
    } catch { /* the feed's class_state says the same once it comes */ }
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
