// Figure geometry, no DOM: how many cache tiles to draw and at what scale, and the memory bar's
// segments. Kept apart from the SVG code so the rules can be read (and tested) on their own.

export const MAX_COLS = 32;
export const MAX_ROWS = 16;

// One tile per block of tokens per sequence; when a sequence would need more than MAX_COLS tiles,
// each tile stands for 2, 4, 8… blocks so the row still fits. Only MAX_ROWS sequences are drawn.
export function tileLayout(ctx, seq, block) {
  let perTile = block;
  while (Math.ceil(ctx / perTile) > MAX_COLS) perTile *= 2;
  const cols = Math.ceil(ctx / perTile);
  return {
    perTile, blocksPerTile: perTile / block, cols, lastFill: (ctx - (cols - 1) * perTile) / perTile,
    rows: Math.min(seq, MAX_ROWS), hiddenRows: Math.max(0, seq - MAX_ROWS),
  };
}

// Weights, cache and free memory as fractions of the bar; the bar spans the larger of the memory
// and what is asked of it, so an overflow shows as a segment past the memory mark.
export function memoryBar(memory, weights, cache) {
  const span = Math.max(memory, weights + cache) || 1;
  return {
    weights: weights / span, cache: cache / span, free: Math.max(0, memory - weights - cache) / span,
    memoryMark: memory / span, over: Math.max(0, weights + cache - memory),
  };
}
