// One lifecycle for every figure. mount(el) wires the figure through a handle from createFigure(el):
// listeners added with listen(), fetches given `signal`, timers from timeout(), frames from frame()
// and cleanups given to onDestroy(). destroy() aborts the handle's AbortController, which removes
// all of those listeners at once, then clears the timers and frames and runs the cleanups, so a
// figure can be mounted again without doubled listeners, and nothing of it runs after destroy().

export function createFigure(el) {
  const controller = new AbortController();
  const { signal } = controller;
  const timers = new Set();
  const frames = new Set();
  const cleanups = [];

  return {
    el,
    signal,
    get alive() { return !signal.aborted; },

    listen(target, type, fn, options = {}) {
      target.addEventListener(type, fn, { ...options, signal });
    },

    // setTimeout that dies with the figure; scheduling after destroy() does nothing.
    timeout(fn, ms) {
      if (signal.aborted) return 0;
      const id = setTimeout(() => { timers.delete(id); fn(); }, ms);
      timers.add(id);
      return id;
    },
    cancelTimeout(id) {
      clearTimeout(id);
      timers.delete(id);
    },

    // requestAnimationFrame that dies with the figure.
    frame(fn) {
      if (signal.aborted) return 0;
      const id = requestAnimationFrame((t) => { frames.delete(id); fn(t); });
      frames.add(id);
      return id;
    },
    cancelFrame(id) {
      cancelAnimationFrame(id);
      frames.delete(id);
    },

    // A function, or an object with destroy(), run on destroy() in reverse order of registration.
    onDestroy(cleanup) {
      if (signal.aborted) runCleanup(cleanup);
      else cleanups.push(cleanup);
      return cleanup;
    },

    destroy() {
      if (signal.aborted) return;
      controller.abort();
      for (const id of timers) clearTimeout(id);
      for (const id of frames) cancelAnimationFrame(id);
      timers.clear();
      frames.clear();
      while (cleanups.length) runCleanup(cleanups.pop());
    },
  };
}

// One failing cleanup must not leave the others undone.
function runCleanup(cleanup) {
  try {
    if (typeof cleanup === 'function') cleanup();
    else cleanup?.destroy();
  } catch (err) {
    console.error('kvscope: a figure cleanup failed', err);
  }
}

// The module-level mount(el) / destroy() pair main.js calls, for a figure built by setup(el, figure).
// Mounting again first destroys the previous instance; a setup that throws is torn down.
export function defineFigure(setup) {
  let current = null;
  function destroy() {
    const figure = current;
    current = null;
    figure?.destroy();
  }
  function mount(el) {
    destroy();
    const figure = createFigure(el);
    current = figure;
    try {
      setup(el, figure);
    } catch (err) {
      destroy();
      throw err;
    }
    return figure;
  }
  return { mount, destroy };
}
