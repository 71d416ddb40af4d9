// Stage 1 figure: step time, per-user and aggregate tokens per second at batch 1..16 (bars), and a
// roofline of the machine with the live prefill and decode points placed by arithmetic intensity.
import { html, svgEl } from '../shared/dom.js';
import { formatFixed, formatInt, formatMs } from '../shared/format.js';
import { axes, barRow, clear, value } from './view.js';
import { decades, logScale, share } from './math.js';
import { pointVerdict, ridge, roof } from '../shared/roofline.js';

const W = 420;
const H = 240;
const M = { top: 14, right: 16, bottom: 40, left: 56 };

// Every power of ten from lo to hi (both powers of ten, as decades() gives them).
function decadeTicks([lo, hi]) {
  const ticks = [];
  for (let d = lo; d <= hi * 1.001; d *= 10) ticks.push(d);
  return ticks;
}

function sci(v) {
  if (!Number.isFinite(v)) return '–';
  const e = Math.floor(Math.log10(v));
  return `${formatFixed(v / 10 ** e, 1)}e${e}`;
}

function bars(parent, points) {
  const agg = points.map((p) => p.aggregate_tps);
  const per = points.map((p) => p.per_user_tps);
  const box = html('div', { cls: 'sv-bars', parent });
  html('p', { cls: 'sv-sub', text: 'Aggregate tokens per second (all users together)', parent: box });
  for (const p of points) {
    // A rate is tokens ÷ the measured step time: computed from the measurement, not itself measured.
    barRow(box, { label: `batch ${p.batch}`, fraction: share(p.aggregate_tps, agg), text: `${formatFixed(p.aggregate_tps, 1)} tok/s`,
      cls: 'sv-agg', provenance: 'computed', data: { batch: p.batch, value: p.aggregate_tps } });
  }
  html('p', { cls: 'sv-sub', text: 'Per-user tokens per second, and the step time behind it', parent: box });
  for (const p of points) {
    const row = barRow(box, { label: `batch ${p.batch}`, fraction: share(p.per_user_tps, per),
      text: `${formatFixed(p.per_user_tps, 1)} tok/s`, cls: 'sv-per', provenance: 'computed', data: { batch: p.batch, value: p.per_user_tps } });
    value(row, formatMs(p.step_ms), 'measured', 'sv-bar-note');
  }
}

function rooflineSvg(parent, rl) {
  const pts = rl.points || [];
  const ridgeI = Number.isFinite(rl.ridge_intensity) ? rl.ridge_intensity : ridge(rl);
  const xs = decades([...pts.map((p) => p.intensity), ridgeI / 10, ridgeI * 10]);
  const ys = decades([...pts.map((p) => p.flops_s), rl.peak_flops_s * 1.5, roof(xs[0], rl)]);
  const x = logScale(xs, [M.left, W - M.right]);
  const y = logScale(ys, [H - M.bottom, M.top]);
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, class: 'sv-roofline', role: 'img',
    'aria-label': 'Roofline of this machine: attainable FLOP/s against arithmetic intensity, log scales' }, { parent });
  axes(svg, { W, H, M }, { x, y, xTicks: decadeTicks(xs), yTicks: decadeTicks(ys), xText: sci, yText: sci,
    xTitle: 'arithmetic intensity (FLOP per byte moved)', yTitle: 'FLOP/s' });
  const line = [xs[0], ridgeI, xs[1]].map((i) => `${x(i)},${y(roof(i, rl))}`).join(' ');
  svgEl('polyline', { points: line, class: 'sv-roof' }, { parent: svg });
  svgEl('line', { x1: x(ridgeI), x2: x(ridgeI), y1: y(roof(ridgeI, rl)), y2: H - M.bottom, class: 'sv-ridge' }, { parent: svg });
  const batches = pts.filter((p) => p.phase === 'decode').map((p) => p.batch);
  const labelled = new Set([Math.min(...batches), Math.max(...batches)]); // the ends; between them labels would collide
  for (const p of pts) {
    const g = svgEl('g', { class: `sv-rpoint sv-${p.phase}`, 'data-phase': p.phase, 'data-intensity': p.intensity,
      'data-flops': p.flops_s, transform: `translate(${x(p.intensity)} ${y(p.flops_s)})` }, { parent: svg });
    svgEl('circle', { r: 5 }, { parent: g });
    svgEl('title', {}, { text: p.phase === 'prefill' ? `prefill, ${p.tokens} tokens` : `decode, batch ${p.batch}`, parent: g });
    if (p.phase === 'decode' && !labelled.has(p.batch)) continue;
    const label = p.phase === 'prefill' ? `prefill, ${formatInt(p.tokens)} tokens` : `decode, batch ${formatInt(p.batch)}`;
    // A label near the right edge reads leftwards, so it stays inside the drawing.
    const right = x(p.intensity) > W * 0.7;
    svgEl('text', { x: right ? -7 : 7, y: 14, class: 'sv-rlabel',
      'text-anchor': right ? 'end' : 'start', 'data-provenance': 'measured' }, { text: label, parent: g });
  }
  return svg;
}

function rooflineNotes(parent, rl) {
  const p = html('p', { cls: 'sv-note', parent });
  p.append('Roof: peak ');
  value(p, `${sci(rl.peak_flops_s)} FLOP/s`, 'measured');
  p.append(', memory bandwidth ');
  value(p, `${sci(rl.bandwidth_bytes_s)} B/s`, 'measured');
  p.append('; the ridge, where the two limits meet, sits at ');
  value(p, `${formatFixed(rl.ridge_intensity ?? ridge(rl), 1)} FLOP/B`, 'computed');
  p.append(' (peak ÷ bandwidth). Left of it memory sets the speed; right of it arithmetic does.');
  // The method in words (which kernel, which sizes): its figures are the measurement's settings.
  if (rl.basis) html('p', { cls: 'sv-note sv-basis', text: `How: ${rl.basis}.`, parent }).dataset.setting = '';
}

// What each measured point says, in words: where it sits against the ridge, how much of the roof above
// it it reached, and the roofline's verdict (its own `verdict` when the recording has one).
function verdicts(parent, rl) {
  const list = html('ul', { cls: 'sv-verdicts', parent });
  list.setAttribute('aria-label', 'What each point shows');
  for (const p of rl.points || []) {
    const v = pointVerdict(p, rl);
    const li = html('li', { parent: list });
    li.dataset.phase = p.phase;
    if (p.phase === 'decode') li.dataset.batch = String(p.batch);
    html('span', { cls: 'sv-verdict-name', text: p.phase === 'prefill' ? `prefill, ${formatInt(p.tokens)} tokens` : `decode, batch ${formatInt(p.batch)}`, parent: li }).dataset.setting = '';
    li.append(': ');
    value(li, `${formatFixed(p.intensity, 1)} FLOP/B`, 'computed');
    li.append(v.side === 'compute-bound' ? ', right of the ridge; reached ' : ', left of the ridge; reached ');
    value(li, `${formatFixed(v.share * 100, 0)} %`, 'computed', 'sv-num sv-share');
    li.append(' of the roof above it — ');
    value(li, v.verdict || `${v.side} by position`, 'computed', 'sv-num sv-verdict');
    li.append('.');
  }
}

export function mount(el) {
  return {
    show(response) {
      clear(el);
      const { points, roofline } = response.result;
      bars(el, points);
      if (roofline) {
        const box = html('div', { cls: 'sv-roofbox', parent: el });
        rooflineSvg(box, roofline);
        rooflineNotes(box, roofline);
        verdicts(box, roofline);
      }
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
