// Stage 1 figure: step time, per-user and aggregate tokens per second at batch 1..16 (bars), and a
// roofline of the recording machine: the roof of the kernel that runs prompts (float32 GEMM on int4 with float32
// copies, the int8 kernel on int8, the route's GEMM on a float route), the copy bandwidth, and each
// point's own ceiling from the kernels that ran it (serving_experiments/roofline.py).
import { html, svgEl } from '../shared/dom.js';
import { formatFixed, formatInt, formatMs } from '../shared/format.js';
import { axes, barRow, clear, setting, value } from './view.js';
import { decades, logScale, share } from './math.js';
import { pointVerdict, ridge, roof, roofKernel } from '../shared/roofline.js';
import { CARRIED, NOT_CARRIED_WORDS, floorProblems, rooflineEvidence, rowsOf } from '../shared/evidence.js';

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
  // Which of the measured steps the bars use: the fastest, as the kernels' ceilings are best-of too.
  const note = html('p', { cls: 'sv-note sv-bars-basis', parent: box });
  const counts = [...new Set(points.map((p) => p.steps_measured).filter(Number.isFinite))];
  note.append('Each bar uses the fastest of the ');
  value(note, counts.map(formatInt).join(' or ') || 'measured', 'measured');
  note.append(' full-batch steps of its batch size, not their median (median steps: ');
  value(note, points.map((p) => formatMs(p.step_ms_median)).join(', '), 'measured');
  note.append('): on a shared machine the slower steps measure the neighbours too, so the sentence beside the bars '
    + 'draws its verdict only where the medians agree with the fastest steps.');
}

const pointName = (p) => (p.phase === 'prefill' ? `prefill, ${formatInt(p.tokens)} tokens` : `decode, batch ${formatInt(p.batch)}`);

// `checked`: the floors pass their own check; a ceiling drawn from floors that fail it would bound nothing.
function rooflineSvg(parent, rl, checked) {
  const pts = rl.points || [];
  const ridgeI = Number.isFinite(rl.ridge_intensity) ? rl.ridge_intensity : ridge(rl);
  const ceilings = pts.map((p) => p.attainable_flops_s).filter(Number.isFinite);
  const xs = decades([...pts.map((p) => p.intensity), ridgeI / 10, ridgeI * 10]);
  const ys = decades([...pts.map((p) => p.flops_s), ...ceilings, rl.peak_flops_s * 1.5, roof(xs[0], rl)]);
  const x = logScale(xs, [M.left, W - M.right]);
  const y = logScale(ys, [H - M.bottom, M.top]);
  const kernel = roofKernel(rl);
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, class: 'sv-roofline', role: 'img',
    'aria-label': `Roofline of the recording machine: ${kernel ? `the ${kernel}'s roof for prompts` : 'the roof for prompts'}, `
      + `the copy bandwidth, ${checked ? 'and each point\'s own ceiling (a tick above it: the kernels that ran it)'
        : 'and the points (their own ceilings not drawn: the floors fail their check)'}, log scales` }, { parent });
  axes(svg, { W, H, M }, { x, y, xTicks: decadeTicks(xs), yTicks: decadeTicks(ys), xText: sci, yText: sci,
    xTitle: 'arithmetic intensity (FLOP per byte moved)', yTitle: 'FLOP/s' });
  const line = [xs[0], ridgeI, xs[1]].map((i) => `${x(i)},${y(roof(i, rl))}`).join(' ');
  svgEl('polyline', { points: line, class: 'sv-roof' }, { parent: svg });
  svgEl('line', { x1: x(ridgeI), x2: x(ridgeI), y1: y(roof(ridgeI, rl)), y2: H - M.bottom, class: 'sv-ridge' }, { parent: svg });
  const batches = pts.filter((p) => p.phase === 'decode').map((p) => p.batch);
  const labelled = new Set([Math.min(...batches), Math.max(...batches)]); // the ends; between them labels would collide
  for (const p of pts) {
    // The point's own ceiling: its FLOPs over the larger of its floors (its kernels alone, its bytes at the bandwidth).
    if (checked && Number.isFinite(p.attainable_flops_s)) {
      const cx = x(p.intensity);
      svgEl('line', { x1: cx, x2: cx, y1: y(p.flops_s), y2: y(p.attainable_flops_s), class: 'sv-ceiling-stem' }, { parent: svg });
      svgEl('line', { x1: cx - 6, x2: cx + 6, y1: y(p.attainable_flops_s), y2: y(p.attainable_flops_s), class: 'sv-ceiling',
        'data-phase': p.phase, 'data-ceiling': p.attainable_flops_s }, { parent: svg });
    }
    const g = svgEl('g', { class: `sv-rpoint sv-${p.phase}`, 'data-phase': p.phase, 'data-intensity': p.intensity,
      'data-flops': p.flops_s, transform: `translate(${x(p.intensity)} ${y(p.flops_s)})` }, { parent: svg });
    svgEl('circle', { r: 5 }, { parent: g });
    svgEl('title', {}, { text: pointName(p), parent: g });
    if (p.phase === 'decode' && !labelled.has(p.batch)) continue;
    // A label near the right edge reads leftwards, so it stays inside the drawing.
    const right = x(p.intensity) > W * 0.7;
    svgEl('text', { x: right ? -7 : 7, y: 14, class: 'sv-rlabel',
      'text-anchor': right ? 'end' : 'start', 'data-provenance': 'measured' }, { text: pointName(p), parent: g });
  }
  return svg;
}

function rooflineNotes(parent, rl, checked) {
  const p = html('p', { cls: 'sv-note', parent });
  const kernel = roofKernel(rl); // as the recording names it: float32 GEMM only where prompts ran on float32 copies
  p.append(`Roof for prompts: ${kernel ? `the ${kernel} that runs them` : 'their kernel'} peaked at `);
  value(p, `${sci(rl.peak_flops_s)} FLOP/s`, 'measured');
  // One kernel at its best size, not the machine's peak: the recording says which sizes.
  if (rl.peak_kernel) { // the kernel and the sizes it was timed at: settings of the measurement
    p.append(' (');
    setting(p, rl.peak_kernel);
    p.append(')');
  }
  p.append('; copy bandwidth ');
  value(p, `${sci(rl.bandwidth_bytes_s)} B/s`, 'measured');
  p.append('; their ridge sits at ');
  value(p, `${formatFixed(rl.ridge_intensity ?? ridge(rl), 1)} FLOP/B`, 'computed');
  // "other kernels" only where the recording's decode points name a kernel other than the roof's
  const other = (rl.points || []).some((q) => q.phase === 'decode' && q.kernel && q.kernel !== kernel);
  p.append(` (peak ÷ bandwidth). ${other ? 'A decode step runs other kernels, so each' : 'Each'} point also has its own `
    + 'ceiling, the tick above it: its FLOPs over the time its own kernels take alone, or its bytes at the copy bandwidth, '
    + `whichever is longer${checked ? '' : '; these floors fail their own check, so no tick is drawn'}.`);
  // The method in words (which kernel, which sizes): its figures are the measurement's settings.
  if (rl.basis) html('p', { cls: 'sv-note sv-basis', text: `How: ${rl.basis}.`, parent }).dataset.setting = '';
}

// The floors' own check (shared/evidence.js), said above the verdicts when it fails: a floor above its step,
// or one that falls as rows grow, bounds nothing, so no point's verdict is carried.
function floorCheck(parent, rl) {
  const problems = floorProblems(rl.points || []);
  if (!problems.length) return true;
  const at = (phase, rows) => (rl.points || []).find((p) => p.phase === phase && rowsOf(p) === rows);
  const note = html('p', { cls: 'sv-note sv-floor-check', parent });
  note.append('These floors fail their own check, so no verdict below is drawn from them: ');
  problems.forEach((q, i) => {
    const p = at(q.phase, q.rows);
    if (i) note.append('; ');
    note.append(`${q.phase} at `);
    setting(note, `${formatInt(q.rows)} row${q.rows === 1 ? '' : 's'}`);
    note.append(': its floor ');
    value(note, formatMs(p.kernel_ms), 'measured');
    if (q.kind === 'falls') {
      note.append(' is below the floor at ');
      setting(note, `${formatInt(q.after)} row${q.after === 1 ? '' : 's'}`);
      note.append(', ');
      value(note, formatMs(at('decode', q.after).kernel_ms), 'measured');
    } else {
      note.append(' is not below its step, ');
      value(note, formatMs(p.step_ms), 'measured');
    }
  });
  note.append('. A lower bound must grow with the rows and stay under the step it bounds; the recorder now refuses '
    + 'a recording that fails this, and this one was made before the check.');
  return false;
}

// What each measured point says, in words: its kernels' time alone and its bytes' time against its own
// time, what holds it back where the evidence carries a verdict (else why not), and how fast its kernels
// read their weights against a plain copy. Where the floors fail their check only the times are said: the
// shares drawn from those floors (the larger floor's, the kernels' bandwidth) would rest on nothing.
function verdicts(parent, rl, steps) {
  const checked = floorCheck(parent, rl);
  const evidenceOf = rooflineEvidence(rl, steps).of;
  const list = html('ul', { cls: 'sv-verdicts', parent });
  list.setAttribute('aria-label', 'What each point shows');
  for (const p of rl.points || []) {
    const v = pointVerdict(p, rl);
    const evidence = evidenceOf(p);
    const li = html('li', { parent: list });
    li.dataset.phase = p.phase;
    if (p.phase === 'decode') li.dataset.batch = String(p.batch);
    html('span', { cls: 'sv-verdict-name', text: pointName(p), parent: li }).dataset.setting = '';
    li.append(': ');
    if (Number.isFinite(p.kernel_ms)) {
      li.append('its kernels (');
      setting(li, p.kernels || p.kernel); // which kernels at which rows: what the step ran, not a finding
      li.append(') alone ');
      value(li, formatMs(p.kernel_ms), 'measured');
      li.append(', its bytes at the copy bandwidth ');
      value(li, formatMs(p.memory_ms), 'computed');
      li.append(', the step ');
      value(li, formatMs(p.step_ms), 'measured');
      if (checked) li.append('; the larger floor fills ');
    } else {
      value(li, `${formatFixed(p.intensity, 1)} FLOP/B`, 'computed');
      li.append('; reached ');
    }
    const floored = Number.isFinite(p.kernel_ms);
    if (checked || !floored) {
      value(li, `${formatFixed(v.share * 100, 0)} %`, 'computed', 'sv-num sv-share');
      li.append(floored ? ' of it — ' : ' of the roof above it — ');
    } else li.append(' — ');
    if (evidence === CARRIED) value(li, v.verdict || `${v.side} by position`, 'computed', 'sv-num sv-verdict');
    else html('span', { cls: 'sv-verdict sv-not-carried', text: NOT_CARRIED_WORDS[evidence], parent: li }).dataset.evidence = evidence;
    if (checked && Number.isFinite(p.kernel_bandwidth_share) && p.held_by !== 'memory') {
      li.append('; its kernels read their weights at ');
      value(li, `${formatFixed(p.kernel_bandwidth_share * 100, 0)} %`, 'computed', 'sv-num sv-kernel-bw');
      li.append(' of the copy bandwidth');
    }
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
        const checked = !floorProblems(roofline.points || []).length;
        rooflineSvg(box, roofline, checked);
        rooflineNotes(box, roofline, checked);
        verdicts(box, roofline, Object.fromEntries(points.map((p) => [p.batch, p.steps_measured])));
      }
    },
    clear() { clear(el); },
    destroy() { clear(el); },
  };
}
