// Paste, type or drop a config.json, or choose a file: one size limit for all three, the text parsed once when
// "Read this config" is pressed or a file arrives (not per keystroke), its relevant keys kept (model.js) and read
// into layer groups (kv-config.js). A file that cannot be read fully is answered with the fields it names and the
// calculator keeps showing the last model it could compute (onError); a clean read goes to onRead.
import { readConfig } from './kv-config.js';
import { parseConfigText } from './model.js';

export const MAX_CONFIG_BYTES = 1 << 20; // a config.json is a few kilobytes; anything this big is not one
const fmt = (n) => n.toLocaleString('en-US');

function tooBig(bytes, what) {
  return {
    field: 'config.json',
    message: `${what} is ${fmt(bytes)} B, more than the ${fmt(MAX_CONFIG_BYTES)} B this calculator reads (pasted or chosen alike)`,
  };
}

export function bindConfigInput(root, figure, table, { onRead, onError }) {
  const text = root.querySelector('[data-field="config"]');
  const file = root.querySelector('[data-field="config-file"]');
  const button = root.querySelector('[data-action="read-config"]');
  const status = root.querySelector('[data-out="config-status"]');

  function refuse(errors) {
    text.setAttribute('aria-invalid', 'true');
    status.textContent = '';
    onError(errors);
  }

  function read(source, name) {
    const bytes = new Blob([source]).size;
    if (bytes > MAX_CONFIG_BYTES) return refuse([tooBig(bytes, name)]);
    const parsed = parseConfigText(source, table);
    if (parsed.error) return refuse([parsed.error]);
    const result = readConfig(parsed.config, table);
    if (result.errors.length) return refuse(result.errors);
    text.setAttribute('aria-invalid', 'false');
    onError([]);
    status.textContent = `Read ${name}: ${result.groups.map((g) => `${g.layers} ${g.kind}`).join(' + ')} layers.`;
    onRead(result, JSON.stringify(parsed.config));
    return null;
  }

  function readFile(f) {
    if (!f) return;
    file.value = ''; // the same file chosen again is a new change, and is read again
    if (f.size > MAX_CONFIG_BYTES) {
      refuse([tooBig(f.size, f.name)]);
      return;
    }
    f.text().then((t) => {
      if (!figure.alive) return;
      text.value = t;
      read(t, f.name);
    });
  }

  figure.listen(button, 'click', () => read(text.value, 'the pasted text'));
  figure.listen(file, 'change', () => readFile(file.files[0]));
  figure.listen(text, 'dragover', (ev) => ev.preventDefault());
  figure.listen(text, 'drop', (ev) => {
    ev.preventDefault();
    readFile(ev.dataTransfer.files[0]);
  });
  return {
    // A link's pasted config shown in the box, as readable JSON.
    show(configText) {
      try {
        text.value = JSON.stringify(JSON.parse(configText), null, 1);
      } catch {
        text.value = configText;
      }
    },
  };
}
