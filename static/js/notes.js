// Numbered source notes: each marker (<a class="note-ref" href="#…-note-N">) shows its note's full
// reference on demand, in one popover, while pointed at or focused (Escape closes it); following the
// link still jumps to the list at the end of the part. mount(root) / destroy() (shared/figure.js).
// The popover's text is a copy of the note's own text (textContent), never markup.
import { defineFigure } from './shared/figure.js';
import { html } from './shared/dom.js';

const POP_ID = 'note-pop';

// The list item a marker points at, or null (a marker to nowhere shows nothing).
export function noteFor(ref, doc = document) {
  const id = (ref.getAttribute('href') || '').replace(/^#/, '');
  return id ? doc.getElementById(id) : null;
}

export const { mount, destroy } = defineFigure((root, figure) => {
  const pop = html('div', { cls: 'note-pop', parent: document.body });
  pop.id = POP_ID;
  pop.setAttribute('role', 'tooltip');
  pop.hidden = true;
  let shownFor = null;
  figure.onDestroy(() => pop.remove());

  function hide() {
    if (shownFor) shownFor.removeAttribute('aria-describedby');
    shownFor = null;
    pop.hidden = true;
  }

  function show(ref) {
    const note = noteFor(ref);
    if (!note) return;
    pop.textContent = `${ref.textContent}. ${note.textContent.replace(/\s+/g, ' ').trim()}`;
    pop.hidden = false;
    const r = ref.getBoundingClientRect();
    const width = pop.offsetWidth;
    const left = Math.max(8, Math.min(r.left + scrollX - width / 2, scrollX + document.documentElement.clientWidth - width - 8));
    pop.style.left = `${left}px`;
    pop.style.top = `${r.bottom + scrollY + 6}px`;
    ref.setAttribute('aria-describedby', POP_ID);
    shownFor = ref;
  }

  const refOf = (event) => (event.target instanceof Element ? event.target.closest('a.note-ref') : null);
  const { listen } = figure;
  listen(root, 'mouseover', (e) => { const ref = refOf(e); if (ref && ref !== shownFor) show(ref); });
  listen(root, 'mouseout', (e) => { if (refOf(e) && !refOf({ target: e.relatedTarget })) hide(); });
  listen(root, 'focusin', (e) => { const ref = refOf(e); if (ref) show(ref); });
  listen(root, 'focusout', (e) => { if (refOf(e)) hide(); });
  listen(document, 'keydown', (e) => { if (e.key === 'Escape' && shownFor) hide(); });
  listen(window, 'scroll', () => { if (shownFor) show(shownFor); }, { passive: true });
});
