// Paste, type or drop a config.json: the text is parsed, its relevant keys kept (model.js) and read into
// layer groups (kv-config.js). A file that cannot be read fully is answered with the fields it names, and
// the calculator keeps showing the last model it could compute (onError); a clean read goes to onRead.
import { readConfig } from './kv-config.js';
import { parseConfigText } from './model.js';

const MAX_FILE_BYTES = 1 << 20; // a config.json is a few kilobytes; anything this big is not one

export function bindConfigInput(root, figure, { onRead, onError }) {
  const text = root.querySelector('[data-field="config"]');
  const file = root.querySelector('[data-field="config-file"]');
  const button = root.querySelector('[data-action="read-config"]');

  function read(source) {
    const parsed = parseConfigText(source);
    const errors = parsed.error ? [parsed.error] : readConfig(parsed.config).errors;
    text.setAttribute('aria-invalid', String(errors.length > 0));
    onError(errors);
    if (!errors.length) onRead(readConfig(parsed.config), JSON.stringify(parsed.config));
  }

  function readFile(f) {
    if (!f) return;
    if (f.size > MAX_FILE_BYTES) {
      onError([{ field: 'config.json', message: `${f.name} is ${f.size.toLocaleString('en-US')} B; a config.json is far smaller` }]);
      return;
    }
    f.text().then((t) => {
      if (!figure.alive) return;
      text.value = t;
      read(t);
    });
  }

  figure.listen(button, 'click', () => read(text.value));
  figure.listen(file, 'change', () => readFile(file.files[0]));
  figure.listen(text, 'dragover', (ev) => ev.preventDefault());
  figure.listen(text, 'drop', (ev) => {
    ev.preventDefault();
    readFile(ev.dataTransfer.files[0]);
  });
}
