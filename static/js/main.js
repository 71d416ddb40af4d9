// Mounts each figure into its section; a figure that fails to mount must not take the others down.
import * as modelStatus from './model-status.js';
import * as walkthrough from './walkthrough/index.js';
import * as calculator from './calculator/index.js';
import * as lab from './lab/index.js';
import * as serving from './serving/index.js';
import * as classFollow from './class-follow.js';
import * as notes from './notes.js';

const figures = { walkthrough, calculator, lab, serving, 'class-follow': classFollow };

function mountAll() {
  modelStatus.mount(document.getElementById('model-status'));
  // The numbered source notes of every part: one popover for the whole page.
  if (document.querySelector('main')) notes.mount(document.querySelector('main'));
  for (const [name, figure] of Object.entries(figures)) {
    const el = document.querySelector(`[data-figure="${name}"]`);
    if (!el) continue;
    try {
      figure.mount(el);
    } catch (err) {
      console.error(`kvscope: the ${name} figure failed to mount`, err);
    }
  }
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', mountAll);
else mountAll();
