// The composer's DOM: system prompt, earlier turns (added and removed here), optional retrieved
// passage and the user message. `read()` gives the plain state composer-model.js turns into
// messages; `onChange` fires on every edit so the prompt view can re-count.

export function mountComposer(root, onChange) {
  const $ = (sel) => root.querySelector(sel);
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
    const li = document.createElement('li');
    li.className = `lab-turn lab-turn-${role}`;
    li.dataset.role = role;
    const label = document.createElement('label');
    label.className = 'lab-turn-label';
    label.htmlFor = id;
    const text = document.createElement('textarea');
    text.id = id;
    text.rows = 2;
    text.value = content;
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.className = 'lab-turn-remove';
    remove.textContent = 'Remove';
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

  root.addEventListener('click', onAddClick);
  root.addEventListener('input', onChange);
  retrievedOn.addEventListener('change', onRetrievedToggle);

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
    destroy() {
      root.removeEventListener('click', onAddClick);
      root.removeEventListener('input', onChange);
      retrievedOn.removeEventListener('change', onRetrievedToggle);
    },
  };
}
