// The live lab figure: wires the composer, controls, prompt view, answer view, experiments and
// history together, and owns `launch`, the one place a run is sent (through ws-client's
// runRequest) and folded into its run record. Exposes mount(el) / destroy() (shared/figure.js): every
// part wires its listeners and timers through the same `figure`, and runs in flight are cancelled.
import { runRequest } from '../ws-client.js';
import { currentModel } from '../model-status.js';
import { defineFigure } from '../shared/figure.js';
import { isConnectionLost } from '../shared/protocol.js';
import { describePrompt, fetchModel } from './api.js';
import { buildPayload } from './composer-model.js';
import { createRun, applyEvent } from './run-state.js';
import { mountComposer } from './composer.js';
import { mountControls } from './controls.js';
import { mountPromptView } from './prompt-view.js';
import { createRunView } from './run-view.js';
import { mountExperiments } from './experiments-view.js';
import { mountHistory } from './history.js';
import * as attention from './attention-view.js';

export const { mount, destroy } = defineFigure((el, figure) => {
  const handles = new Set(); // runs in flight, cancelled on destroy
  let facts = currentModel()?.facts || null;
  let mainHandle = null;
  const runButton = el.querySelector('#lab-run');
  const stopButton = el.querySelector('#lab-stop-button');
  const controlsForm = el.querySelector('#lab-controls');

  // Model facts for exported traces: the ones the status poller saw, else asked for now.
  async function getFacts() {
    if (!facts) facts = (await fetchModel()).data?.facts || null;
    return facts;
  }
  const history = mountHistory(el, { getFacts }, figure);
  const promptView = mountPromptView(el, figure);
  const runView = createRunView(el, figure);
  const onEdit = () => promptView.schedule(currentPayload());
  const composer = mountComposer(el.querySelector('#lab-composer'), onEdit, figure);
  const controls = mountControls(controlsForm, onEdit, figure);
  const currentPayload = () => buildPayload(composer.read(), controls.read());

  // The prompt description a trace export needs: the prompt view's if it counted this very payload,
  // else asked for after the run, so counting never competes with a run being measured.
  async function describeForExport(payload) {
    const known = promptView.describedFor(payload);
    if (known) return known;
    const result = await describePrompt(payload);
    return result.ok ? result.data : null;
  }

  // Sends one request and keeps its run record current. Resolves `done` with the run once it has
  // ended and its prompt description is known.
  function launch(payload, { kind, label = '', onUpdate = () => {}, onEvent: watch = () => {} }) {
    const run = createRun({ id: history.newId(), kind, label, payload });
    history.add(run);
    const handle = runRequest(payload, {
      onOpen(requestId) {
        run.requestId = requestId;
        run.sentAt = performance.now();
      },
      onEvent(event) {
        const before = run.status;
        applyEvent(run, event, performance.now());
        watch(event);
        onUpdate(run);
        if (run.status !== before) history.refresh(run);
      },
    });
    handles.add(handle);
    const done = handle.done.then(async (terminal) => {
      // A dropped socket never reaches onEvent: ws-client settles with a synthetic event instead.
      if (isConnectionLost(terminal)) applyEvent(run, terminal, performance.now());
      handles.delete(handle);
      run.prompt = await describeForExport(payload);
      onUpdate(run);
      history.refresh(run);
      return run;
    });
    return { run, cancel: handle.cancel, done };
  }

  function onRun(ev) {
    ev.preventDefault();
    if (mainHandle) return;
    const { run, cancel, done } = launch(attention.prepare(currentPayload()), {
      kind: 'your run', onUpdate: () => runView.update(), onEvent: attention.apply,
    });
    mainHandle = { cancel };
    runView.show(run);
    runButton.disabled = true;
    stopButton.disabled = false;
    done.then(() => {
      mainHandle = null;
      if (!figure.alive) return;
      runView.flush();
      runButton.disabled = false;
      stopButton.disabled = true;
      stopButton.textContent = 'Stop';
    });
  }

  function onStop() {
    if (!mainHandle) return;
    mainHandle.cancel();
    stopButton.disabled = true;
    stopButton.textContent = 'Stopping…';
  }

  function onModel(ev) {
    facts = ev.detail?.facts || facts;
    if (ev.detail?.status === 'ready') onEdit();
  }

  figure.listen(controlsForm, 'submit', onRun);
  figure.listen(stopButton, 'click', onStop);
  figure.listen(document, 'kvscope:model', onModel);
  figure.onDestroy(() => { for (const h of handles) h.cancel(); });
  mountExperiments(el, launch, figure);
  attention.mount(el.querySelector('#lab-attention'));
  figure.onDestroy(attention.destroy);
  onEdit();
});
