// The composer's DOM: system prompt, earlier turns (added and removed here), optional retrieved
// passage and the user message. `read()` gives the plain state composer-model.js turns into
// messages; `onChange` fires on every edit so the prompt view can re-count. Listeners go through the
// lab's `figure` (shared/figure.js), so they end with it.
import { finder, html } from '../shared/dom.js';

export function mountComposer(root, onChange, figure) {
  const $ = finder(root);
  const list = $('#lab-turns');
  const retrievedOn = $('#lab-retrieved-on');
  const retrievedField = $('#lab-retrieved-field');
  let turnCounter = 0;

  function renumber() {
    list.querySelectorAll('li').forEach((li, i) => {
      const role = li.dataset.role;
      li.querySelector('.lab-turn-label').textContent = `${i + 1}. ${role === 'user' ? 'User' : 'Assistant'}`;
      li.querySelector('.lab-turn-remove').setAttribute('aria-label', `Remove turn ${i + 1} (${role})`);
    });
  }

  function addTurn(role, content = '') {
    turnCounter += 1;
    const id = `lab-turn-${turnCounter}`;
    const li = html('li', { cls: `lab-turn lab-turn-${role}` });
    li.dataset.role = role;
    const label = html('label', { cls: 'lab-turn-label' });
    label.htmlFor = id;
    const text = html('textarea');
    text.id = id;
    text.rows = 2;
    text.value = content;
    const remove = html('button', { cls: 'lab-turn-remove', text: 'Remove' });
    remove.type = 'button';
    // A plain listener: it goes with its button when the turn is removed (through the figure, the
    // signal would keep every removed turn alive until destroy()).
    remove.addEventListener('click', () => {
      const next = li.nextElementSibling || li.previousElementSibling;
      li.remove();
      renumber();
      // Keep keyboard focus in the list rather than dropping it to <body>.
      (next?.querySelector('textarea') || root.querySelector('[data-add-turn]')).focus();
      onChange();
    });
    li.append(label, text, remove);
    list.append(li);
    renumber();
    return text;
  }

  function onAddClick(ev) {
    const role = ev.target.closest('[data-add-turn]')?.dataset.addTurn;
    if (!role) return;
    addTurn(role).focus();
    onChange();
  }

  function onRetrievedToggle() {
    retrievedField.hidden = !retrievedOn.checked;
    onChange();
  }

  figure.listen(root, 'click', onAddClick);
  figure.listen(root, 'input', onChange);
  figure.listen(retrievedOn, 'change', onRetrievedToggle);

  return {
    addTurn,
    read() {
      return {
        system: $('#lab-system').value,
        turns: [...list.querySelectorAll('li')].map((li) => ({ role: li.dataset.role, content: li.querySelector('textarea').value })),
        retrieved: retrievedOn.checked ? $('#lab-retrieved').value : null,
        user: $('#lab-user').value,
      };
    },
  };
}
