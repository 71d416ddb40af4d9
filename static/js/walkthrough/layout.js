// Pure geometry of the walkthrough figure in SVG user units: lanes, the token grid, cache columns,
// queue slots and the timeline strip. No DOM; figure.js draws what these functions return.
export const W = 360;
export const H = 198;

export const LANES = {
  messages: { label: 9, top: 13, height: 28 },
  prompt: { label: 53, top: 58, height: 40 },
  queue: { label: 110, top: 114, height: 30, x: 0, width: 96 },
  model: { label: 110, top: 114, height: 30, x: 104, width: W - 104 },
  cache: { label: 157, top: 162, height: 34 },
};

// Message cards side by side across the full width.
export function messageCards(count, gap = 4) {
  const width = count ? (W - gap * (count - 1)) / count : 0;
  return Array.from({ length: count }, (_, i) => ({ x: i * (width + gap), y: LANES.messages.top, width, height: LANES.messages.height }));
}

// The largest square cells (at most 10 units) that fit `capacity` cells in the prompt lane; capacity
// covers the prompt plus the token budget, so the grid never reflows while tokens arrive.
export function tokenGrid(capacity) {
  const { top, height } = LANES.prompt;
  const n = Math.max(capacity, 1);
  const fits = (p) => Math.ceil(n / Math.floor(W / p)) * p <= height;
  let pitch = Math.min(10, Math.sqrt((W * height) / n));
  while (!fits(pitch)) pitch *= 0.98;
  const cols = Math.floor(W / pitch);
  const cell = pitch > 3 ? pitch - 1 : pitch * 0.8;
  return { pitch, cols, cell, at: (i) => ({ x: (i % cols) * pitch, y: top + Math.floor(i / cols) * pitch }) };
}

// One column per cached position, sized so `capacity` columns fill the lane.
export function cacheColumns(capacity) {
  const width = W / Math.max(capacity, 1);
  return { width, gap: width > 3 ? 0.6 : 0, at: (i) => ({ x: i * width, y: LANES.cache.top, height: LANES.cache.height }) };
}

// Queue slots: slot 1 (next to run) sits nearest the model lane.
export function queueSlot(position, slots = 3) {
  const { x, width, top, height } = LANES.queue;
  const slotW = (width - 4 * (slots + 1)) / slots;
  const k = Math.min(Math.max(position, 1), slots);
  return { x: x + width - k * (slotW + 4), y: top + 4, width: slotW, height: height - 8 };
}

// Decode ticks along the model lane's lower half, one per decode step, spaced by the token budget.
export function decodeTick(step, maxSteps) {
  const { x, width, top } = LANES.model;
  const w = width / Math.max(maxSteps, 1);
  return { x: x + step * w, y: top + 17, width: Math.max(w - (w > 3 ? 1 : 0), 0.5), height: 11 };
}

// The timeline strip as fractions of its width: every segment keeps its real ms; segments too thin
// to see get a minimum width so a 0.5 ms queue wait still shows (the label carries the real value).
export function timelineBoxes(timeline, minFraction = 0.004) {
  const total = timeline.totalMs || 0;
  if (!timeline.segments.length || total <= 0) return [];
  return timeline.segments.map((s) => ({
    ...s,
    left: (s.from - timeline.start) / total,
    width: Math.max(s.ms / total, minFraction),
  }));
}
