// The run controls' DOM: reads max new tokens, sampling, stop strings, the constraint, delivery, KV
// cache and prefill chunk as plain values; enables the sampling fields only when sampling is chosen
// and the choices only when "choose one of" is.
import { finder } from '../shared/dom.js';

export function mountControls(root, onChange, figure) {
  const $ = finder(root);
  const checked = (name) => root.querySelector(`input[name="${name}"]:checked`).value;

  function syncSampling() {
    const sampling = checked('lab-sampling') === 'sample';
    root.querySelectorAll('.lab-sampling-field input').forEach((input) => { input.disabled = !sampling; });
  }

  function syncConstraint() {
    $('#lab-choices').disabled = $('#lab-constraint').value !== 'choice';
  }

  function onEdit(ev) {
    if (ev.target.name === 'lab-sampling') syncSampling();
    if (ev.target.id === 'lab-constraint') syncConstraint();
    onChange();
  }

  // `input` fires for text, number, select, radio and checkbox edits alike.
  figure.listen(root, 'input', onEdit);
  syncSampling();
  syncConstraint();

  return {
    read() {
      return {
        maxNewTokens: $('#lab-max-new').value,
        overflow: $('#lab-overflow').value,
        sampling: checked('lab-sampling'),
        temperature: $('#lab-temperature').value,
        topK: $('#lab-top-k').value,
        topP: $('#lab-top-p').value,
        seed: $('#lab-seed').value,
        stop: $('#lab-stop').value,
        constraint: $('#lab-constraint').value,
        choices: $('#lab-choices').value,
        delivery: checked('lab-delivery'),
        kvCache: $('#lab-kv-cache').checked,
        prefillChunk: $('#lab-prefill-chunk').value,
      };
    },
  };
}
