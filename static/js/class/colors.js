// Colours the class view gives requests and cell kinds: one colour per request key, the same in the
// lanes and the block map, so the projector links a laptop's row to its KV blocks at a glance.

// Twelve hues that stay apart on a dark background and through a washed-out projector.
const PALETTE = ['#4cc9f0', '#f72585', '#ffd166', '#06d6a0', '#f4a261', '#b388ff', '#90be6d', '#ff6b6b',
  '#48bfe3', '#e9c46a', '#c77dff', '#80ffdb'];

// Cell kinds in the batch grid (the same names as the feed's `kind` and the lanes' states).
export const KIND_COLOURS = Object.freeze({
  prefill: '#f4a261',
  decode: '#4cc9f0',
  recompute: '#c77dff',
  waiting: '#5c6370',
  preempted: '#ff6b6b',
});

// A stable colour from the key's number (r17 → 17), so a request keeps its colour across redraws.
export function colourFor(key) {
  const n = Number(/(\d+)$/.exec(String(key))?.[1] ?? NaN);
  const i = Number.isFinite(n) ? n : [...String(key)].reduce((a, c) => a + c.charCodeAt(0), 0);
  return PALETTE[i % PALETTE.length];
}
