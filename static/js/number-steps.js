/* Arrow keys on a number input whose step is "any" (any value in bounds is valid):
 * move by the input's data-step, kept inside min and max, instead of the browser's
 * default step of 1, which jumps a ratio straight to a bound. */
(function () {
  "use strict";
  document.addEventListener("keydown", function (event) {
    var input = event.target;
    if (!(input instanceof HTMLInputElement) || input.type !== "number" || !input.dataset.step) return;
    if (event.key !== "ArrowUp" && event.key !== "ArrowDown") return;
    event.preventDefault();
    var step = Number(input.dataset.step);
    var value = Number(input.value || input.min || 0) + (event.key === "ArrowUp" ? step : -step);
    var decimals = (String(input.dataset.step).split(".")[1] || "").length;
    value = Number((Math.round(value / step) * step).toFixed(decimals));
    if (input.min !== "") value = Math.max(Number(input.min), value);
    if (input.max !== "") value = Math.min(Number(input.max), value);
    input.value = String(value);
    input.dispatchEvent(new Event("input", { bubbles: true }));
  });
})();
