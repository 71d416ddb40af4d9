// A verdict needs its evidence: the twin of serving_experiments/evidence.py (both read
// tests/data/evidence-cases.json). A roofline's floors must each sit below the fastest step they bound and,
// for decode steps, not fall as rows grow; a point's verdict is carried only with consistent floors, enough
// measured steps and the same verdict at its fastest and its median step. Pure, no DOM.

// A floor more rows need may come out this much below the floor of fewer rows before it counts as falling.
export const FLOOR_SLACK = 0.05;
// The fewest measured steps a verdict rests on.
export const MIN_STEPS = 3;

export const CARRIED = 'carried';
export const FLOORS = 'floors';
export const LOADED = 'loaded';
export const FEW_STEPS = 'few steps';
export const NO_MEDIAN = 'no median';
export const MIXED = 'mixed';

export const rowsOf = (p) => p.rows || p.batch || p.tokens || 0;

// [{kind: 'above step' | 'falls', phase, rows, after}] in the Python order: every floor not below its step,
// then every decode floor more than FLOOR_SLACK below the floor of fewer rows. [] = consistent.
export function floorProblems(points) {
  const timed = (points || []).filter((p) => Number.isFinite(p.kernel_ms) && Number.isFinite(p.step_ms));
  const problems = timed.filter((p) => p.kernel_ms >= p.step_ms)
    .map((p) => ({ kind: 'above step', phase: p.phase, rows: rowsOf(p), after: null }));
  const decodes = timed.filter((p) => p.phase === 'decode').sort((a, b) => rowsOf(a) - rowsOf(b));
  for (let i = 1; i < decodes.length; i += 1) {
    if (decodes[i].kernel_ms < decodes[i - 1].kernel_ms * (1 - FLOOR_SLACK)) {
      problems.push({ kind: 'falls', phase: 'decode', rows: rowsOf(decodes[i]), after: rowsOf(decodes[i - 1]) });
    }
  }
  return problems;
}

// Whether the machine ran more runnable work than the steps' threads (evidence.py loaded).
export function loaded(load1m, threads) {
  return Number.isFinite(load1m) && Number.isFinite(threads) && load1m > threads;
}

// Whether one point's verdict is carried, else why not (evidence.py point_evidence).
export function pointEvidence(point, floorsConsistent, machineLoaded = false) {
  if (!floorsConsistent) return FLOORS;
  if (machineLoaded) return LOADED;
  if (!((point.steps_measured || 0) >= MIN_STEPS)) return FEW_STEPS;
  if (!point.held_by_median) return NO_MEDIAN;
  return point.held_by_median === point.held_by ? CARRIED : MIXED;
}

// Why a point's verdict is not printed, in words that follow "the verdict is" or "— " on the page.
export const NOT_CARRIED_WORDS = {
  [FLOORS]: 'none drawn: this recording\'s floors fail their own check, so they bound nothing',
  [LOADED]: 'none drawn: the machine was loaded past its threads, so the steps measure the other processes too',
  [FEW_STEPS]: 'none drawn: too few steps were measured to give it a median',
  [NO_MEDIAN]: 'none drawn: the recording has no verdict at the median step to set beside the fastest',
  [MIXED]: 'none drawn: the evidence is mixed, the fastest and the median step give different verdicts',
};

// A roofline's evidence: whether its floors pass their check, and each point's evidence, the decode points'
// step counts taken from `steps` ({batch: steps measured}) where the points do not carry their own.
export function rooflineEvidence(roofline, steps = {}) {
  const points = (roofline && roofline.points) || [];
  const problems = floorProblems(points);
  // the load as the roofline was measured (recorded with it since the check; older recordings do not say)
  const busy = loaded(roofline && roofline.load_1m, roofline && roofline.threads);
  const of = (p) => pointEvidence({ steps_measured: p.phase === 'decode' ? steps[p.batch] : undefined, ...p },
    !problems.length, busy);
  return { problems, consistent: !problems.length, of };
}
