// What each engine would cache for the chosen config, one line per engine: its bytes per token and per sequence at
// this length under the page's storage (with the engine's own rule where it has one, e.g. vLLM's conv-state
// columns), or that it does not serve the model, and the source line it follows. Pure rendering of kv-config.js's
// `engines` through kv-layers.js.
import { html } from '../shared/dom.js';
import { formatBytes, plural } from '../shared/format.js';
import { KvInputError, cacheBytes } from './kv-layers.js';

function engineLine(e, storage, ctx) {
  if (!e.groups) return `${e.engine}: not counted here (${e.source}).`;
  try {
    const bytes = cacheBytes(e.groups, ctx, 1, { ...storage, ...(e.storage || {}) });
    const image = bytes.perImageBytes ? ` + ${formatBytes(bytes.perImageBytes)} per image` : '';
    return `${e.engine}: ${formatBytes(bytes.perTokenBytes)} per token${image}, ${formatBytes(bytes.sequenceBytes)} `
      + `for one sequence of ${plural(ctx, 'token')}. ${e.source}.`;
  } catch (err) {
    if (!(err instanceof KvInputError)) throw err;
    return `${e.engine}: not computed for these inputs (${err.message}). ${e.source}.`;
  }
}

// `engines` empty (a plain model, or one that every engine caches alike) hides the part.
export function renderEngines(el, engines, storage, ctx) {
  const list = engines || [];
  el.hidden = !list.length;
  el.replaceChildren();
  if (!list.length) return;
  html('p', { text: 'What each engine would cache for this config (cited: the source line each follows):', parent: el });
  const ul = html('ul', { parent: el });
  for (const e of list) html('li', { text: engineLine(e, storage, ctx), parent: ul });
}
