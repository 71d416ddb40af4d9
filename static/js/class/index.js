// The class view's entry: mounts the feed connection and each figure into its element
// ([data-class-figure="name"]); a figure that fails to mount must not take the others down.
import * as feed from './feed.js';
import * as join from './join.js';
import * as counters from './counters.js';
import * as lanes from './lanes.js';
import * as batchGrid from './batch-grid.js';
import * as blockMap from './block-map.js';
import * as controls from './controls.js';
import * as mode from './mode.js';

// Figures first, so they are listening when the feed's first state arrives.
const figures = { join, counters, lanes, 'batch-grid': batchGrid, 'block-map': blockMap, controls, mode, feed };

export function mountAll(root = document) {
  for (const [name, figure] of Object.entries(figures)) {
    const el = root.querySelector(`[data-class-figure="${name}"]`);
    if (!el) continue;
    try {
      figure.mount(el);
    } catch (err) {
      console.error(`kvscope: the class ${name} figure failed to mount`, err);
    }
  }
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', () => mountAll());
else mountAll();
