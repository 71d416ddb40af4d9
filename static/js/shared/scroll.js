// Reports which story step sits at the reading line while the page scrolls. An IntersectionObserver
// watches a thin band at that line; the active step is then read from geometry (the last step whose
// top is above the line), so a late callback still reports where the page is now.
const WIDE = '(min-width: 900px)';

// The reading line, as a fraction of the viewport height; the CSS `scroll-margin-top` of the steps
// in walkthrough.css uses the same fractions so deep links land on it.
export const probeFraction = () => (window.matchMedia(WIDE).matches ? 0.5 : 0.8);

export function activeStep(steps) {
  const line = window.innerHeight * probeFraction();
  let found = 0;
  steps.forEach((step, i) => { if (step.getBoundingClientRect().top <= line + 1) found = i; });
  return found;
}

export function observeSteps(steps, onActive) {
  let io = null;
  const build = () => {
    if (io) io.disconnect();
    const top = probeFraction() * 100;
    io = new IntersectionObserver(() => onActive(activeStep(steps)),
      { rootMargin: `-${top}% 0px -${99 - top}% 0px`, threshold: 0 });
    steps.forEach((step) => io.observe(step));
  };
  build();
  const mq = window.matchMedia(WIDE);
  mq.addEventListener('change', build);
  return () => { io.disconnect(); mq.removeEventListener('change', build); };
}

// Brings a step to the reading line at once (the steps' scroll-margin-top puts it there).
export function scrollToStep(step) {
  step.scrollIntoView({ block: 'start', behavior: 'instant' });
}
