// Stage 2 figure: the static and the continuous run side by side as step-by-request grids (one cell
// per request per engine step, coloured by what the request did), idle slots visible, with each run's
// throughput, p95 latency and idle-slot share.
import { html } from '../shared/dom.js';
import { formatFixed, formatMs } from '../shared/format.js';
import { clear, readouts } from './view.js';
import { cellCounts, freeSlots, gridRequests } from './math.js';

export const STATES = ['prefill', 'decode', 'waiting', 'idle', 'done', 'preempted'];
const RUNS = [['static', 'Static batching'], ['continuous', 'Continuous batching']];

// The last row: how many of the batch's slots ran nothing at each step (a cell's height is that share).
function idleRow(g, run, slots) {
  html('span', { cls: 'sv-grid-name', text: 'idle', parent: g });
  for (const step of run.steps) {
    const free = freeSlots(step, slots);
    const cell = html('span', { cls: 'sv-cell sv-free', parent: g });
    const fill = html('span', { cls: 'sv-free-fill', parent: cell });
    fill.style.height = `${(free / slots) * 100}%`;
    cell.dataset.free = String(free);
    cell.title = `step ${step.step}: ${free} of ${slots} slots idle`;
  }
}

function grid(parent, workload, run, name, slots) {
  const requests = gridRequests(workload, run);
  const wrap = html('div', { cls: 'sv-grid-wrap', parent });
  const g = html('div', { cls: 'sv-grid', parent: wrap });
  g.dataset.run = name;
  g.setAttribute('role', 'img');
  const counts = cellCounts(run);
  g.setAttribute('aria-label', `${name} batching: ${run.steps.length} steps; `
    + STATES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(', '));
  g.style.gridTemplateColumns = `3.2em repeat(${run.steps.length}, minmax(6px, 1fr))`;
  for (const request of requests) {
    html('span', { cls: 'sv-grid-name', text: request, parent: g }).dataset.setting = '';
    for (const step of run.steps) {
      const state = step.cells[request] || 'done';
      const cell = html('span', { cls: `sv-cell is-${state}`, parent: g });
      cell.dataset.state = state;
      cell.title = `${request}, step ${step.step}: ${state}`;
    }
  }
  if (slots > 0) idleRow(g, run, slots);
  return g;
}

function legend(parent) {
  const ul = html('ul', { cls: 'sv-legend', parent });
  for (const s of STATES) html('li', { cls: `sv-key is-${s}`, text: s, parent: ul });
}

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const { workload, runs, batch_size: slots } = response.result;
      legend(el);
      const pair = html('div', { cls: 'sv-pair', parent: el });
      for (const [name, title] of RUNS) {
        const run = runs[name];
        if (!run) continue;
        const col = html('div', { cls: 'sv-col', parent: pair });
        col.dataset.run = name;
        html('p', { cls: 'sv-sub', text: title, parent: col });
        grid(col, workload, run, name, slots);
        readouts(col, [
          ['throughput', `${formatFixed(run.throughput_tps, 1)} tok/s`, 'computed', 'throughput'], // tokens ÷ measured time
          ['p95 latency', formatMs(run.p95_latency_ms), 'measured', 'p95'],
          ['idle slots', `${formatFixed(run.idle_slot_share * 100, 1)} %`, 'computed', 'idle'], // a share of counted cells
        ]);
      }
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
