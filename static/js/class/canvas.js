// A canvas sized to its box at the screen's pixel ratio; draw(ctx, {w, h}) runs when the box changes
// size and on redraw(). Shared by the batch grid and the block map (both draw hundreds of cells,
// which DOM nodes would make slow).

export function fitCanvas(figure, canvas, draw) {
  const ctx = canvas.getContext('2d');
  let size = { w: 0, h: 0 };
  function resize() {
    const box = canvas.getBoundingClientRect();
    const ratio = window.devicePixelRatio || 1;
    size = { w: Math.max(1, Math.round(box.width)), h: Math.max(1, Math.round(box.height)) };
    canvas.width = size.w * ratio;
    canvas.height = size.h * ratio;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    draw(ctx, size);
  }
  const observer = new ResizeObserver(() => resize());
  observer.observe(canvas);
  figure.onDestroy(() => observer.disconnect());
  resize();
  return { redraw: () => draw(ctx, size) };
}

// The CSS custom property's value on `el` (the page's colours live in class.css).
export function cssVar(el, name, fallback) {
  return getComputedStyle(el).getPropertyValue(name).trim() || fallback;
}
