// The run controls' DOM: reads max new tokens, sampling, stop strings, delivery, KV cache and
// prefill chunk as plain values, and enables the sampling fields only when sampling is chosen.
import { finder } from '../shared/dom.js';

export function mountControls(root, onChange, figure) {
  const $ = finder(root);
  const checked = (name) => root.querySelector(`input[name="${name}"]:checked`).value;

  function syncSampling() {
    const sampling = checked('lab-sampling') === 'sample';
    root.querySelectorAll('.lab-sampling-field input').forEach((input) => { input.disabled = !sampling; });
  }

  function onEdit(ev) {
    if (ev.target.name === 'lab-sampling') syncSampling();
    onChange();
  }

  // `input` fires for text, number, select, radio and checkbox edits alike.
  figure.listen(root, 'input', onEdit);
  syncSampling();

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
        delivery: checked('lab-delivery'),
        kvCache: $('#lab-kv-cache').checked,
        prefillChunk: $('#lab-prefill-chunk').value,
      };
    },
  };
}
