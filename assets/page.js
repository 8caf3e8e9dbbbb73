// Runs before Gradio's own scripts (app/api/page_head.py puts it first in the page's <head>).
// Gradio 6's status tracker counts a pending event's elapsed time in a requestAnimationFrame loop that stops only when
// the tracker sees its status leave "pending". The page's own loading tracker is removed while still pending, so its
// loop never stops: every open tab redraws at the display's rate for as long as it is open, idle or not (about a tenth
// of a core on a 2-core machine, taken from the model's threads; docs/bench.md, "The idle page"). That loop's frames
// are spaced to four a second here: the elapsed time it shows keeps its tenths, and a dead loop costs 4 frames a
// second instead of 60. Every other animation frame is untouched.
(() => {
  const raf = window.requestAnimationFrame.bind(window);
  const ELAPSED_LOOP = /performance\.now\(\)\s*-\s*[\w$]+\([\w$]+\)\)\s*\/\s*1e3\s*\)\s*,\s*[\w$]+\s*&&\s*[\w$]+\(\)\s*;?\s*\}$/;
  const SPACING_MS = 250;
  window.__speclensFrames = { asked: 0, spaced: 0 };  // frames Gradio asked for, and of them those spaced out
  window.requestAnimationFrame = function (callback) {
    window.__speclensFrames.asked += 1;
    let source = "";
    try { source = Function.prototype.toString.call(callback); } catch (e) { /* not a function: let the browser say */ }
    if (ELAPSED_LOOP.test(source)) {
      window.__speclensFrames.spaced += 1;
      return setTimeout(() => raf(callback), SPACING_MS);
    }
    return raf(callback);
  };
})();
