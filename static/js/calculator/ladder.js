// Slider stops on a log scale, no DOM: four stops per doubling (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16,
// 20, …) so one arrow press is a small step at 3 tokens and at 100,000 alike; PageUp doubles.

export const STOPS_PER_OCTAVE = 4;

export function ladder(min, max) {
  const stops = new Set([min, max]);
  for (let base = 1; base <= max; base *= 2) {
    for (let i = 0; i < STOPS_PER_OCTAVE; i += 1) {
      const v = Math.round(base * (1 + i / STOPS_PER_OCTAVE));
      if (v >= min && v <= max) stops.add(v);
    }
  }
  return [...stops].sort((a, b) => a - b);
}

// The next stop above (dir 1) or below (dir -1) `value`, clamped at the ends. A value between stops
// (typed in, like 1,200) steps to its neighbouring stop.
export function stepStop(stops, value, dir) {
  const i = dir > 0 ? stops.findIndex((s) => s > value) : stops.findLastIndex((s) => s < value);
  if (i === -1) return dir > 0 ? stops[stops.length - 1] : stops[0];
  return stops[i];
}

// PageUp / PageDown: the first stop at or beyond double (dir 1) or half (dir -1) of `value`.
// Powers of two are stops, so from 1 each PageUp lands exactly on 2, 4, 8, … 8,192.
export function doubleStop(stops, value, dir) {
  if (dir > 0) return stops.find((s) => s >= value * 2) ?? stops[stops.length - 1];
  const i = stops.findLastIndex((s) => s <= value / 2);
  return i === -1 ? stops[0] : stops[i];
}

// Position 0…1 along the track for any value in [min, max], log-scaled.
export function fraction(value, min, max) {
  if (max === min) return 0;
  return (Math.log(value) - Math.log(min)) / (Math.log(max) - Math.log(min));
}

// The stop nearest (in log distance) to track position f.
export function stopAt(stops, f) {
  const min = stops[0];
  const max = stops[stops.length - 1];
  const target = Math.log(min) + Math.min(1, Math.max(0, f)) * (Math.log(max) - Math.log(min));
  let best = stops[0];
  for (const s of stops) if (Math.abs(Math.log(s) - target) < Math.abs(Math.log(best) - target)) best = s;
  return best;
}
