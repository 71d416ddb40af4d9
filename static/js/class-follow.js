// The classroom on the students' page: when the server is in class mode (GET /api/class), a notice
// stays in view while the teacher's "show prompts" is on (so a student knows before sending), and a
// "follow the teacher" opt-in makes the walkthrough go to the teacher's stage. On the teacher's own
// page, each walkthrough stage change is POSTed to /api/class/stage. Outside class mode: nothing.
import { defineFigure } from './shared/figure.js';
import { finder } from './shared/dom.js';
import { wsUrl } from './ws-client.js';
import { FEED } from './shared/protocol.js';

const RETRY_MS = 3000;
const STAGE_DEBOUNCE_MS = 400; // a scroll passes several stages: send only where the teacher stops

export const NOTICE_TEXT = 'The teacher has turned on “show prompts”: what you send now, and the answer, '
  + 'appear on the projected class screen. Do not type anything private.';

export const { mount, destroy } = defineFigure((el, figure) => {
  const q = finder(el);
  const dom = { follow: q('[data-class-follow]'), note: q('[data-class-note]'), notice: q('[data-class-notice]') };
  let socket = null;
  let following = false;

  function showPrompts(on) {
    dom.notice.textContent = on ? NOTICE_TEXT : '';
    dom.notice.hidden = !on;
    document.body.classList.toggle('class-prompts-shown', on);
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  // One socket for the class messages (notices and stages); the lab's requests use their own.
  function connect() {
    socket = new WebSocket(wsUrl());
    figure.listen(socket, 'open', () => { if (following) send({ type: 'follow' }); });
    figure.listen(socket, 'message', (msg) => {
      let event;
      try { event = JSON.parse(msg.data); } catch { return; }
      if (event.type === FEED.CLASS_NOTICE) showPrompts(!!event.show_prompts);
      if (event.type === FEED.CLASS_STAGE && following) {
        document.dispatchEvent(new CustomEvent('kvscope:goto-stage', { detail: { stage: event.stage } }));
      }
    });
    figure.listen(socket, 'close', () => figure.timeout(connect, RETRY_MS));
  }

  function asStudent(info) {
    el.hidden = false;
    dom.follow.closest('label').hidden = false;
    dom.note.textContent = 'Class mode: your requests show on the teacher’s screen as a numbered laptop, '
      + 'without their text unless the notice below says otherwise.';
    showPrompts(!!info.settings?.show_prompts);
    figure.listen(dom.follow, 'change', () => {
      following = dom.follow.checked;
      send({ type: following ? 'follow' : 'unfollow' });
    });
    connect();
  }

  function asTeacher() {
    el.hidden = false;
    dom.note.textContent = 'You are the teacher: students who choose “follow the teacher” see the walkthrough '
      + 'stage you are on.';
    let timer = 0;
    figure.listen(document, 'kvscope:stage', (e) => {
      figure.cancelTimeout(timer);
      timer = figure.timeout(() => postStage(e.detail.stage), STAGE_DEBOUNCE_MS);
    });
  }

  async function postStage(stage) {
    try {
      await fetch('/api/class/stage', { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ stage }), signal: figure.signal });
    } catch { /* the next stage change tries again */ }
  }

  figure.onDestroy(() => {
    if (socket && socket.readyState <= WebSocket.OPEN) socket.close(1000);
    document.body.classList.remove('class-prompts-shown');
  });

  (async () => {
    let info;
    try {
      const res = await fetch('/api/class', { signal: figure.signal });
      if (!res.ok) return;
      info = await res.json();
    } catch { return; } // no class API (or destroyed): the page is a plain single-user page
    if (!figure.alive || !info.class_mode) return;
    if (info.teacher) asTeacher();
    else asStudent(info);
  })();
});
