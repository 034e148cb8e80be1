/* Small behaviours every page may use, as listeners in a file: the pages' CSP
 * (script-src 'self', no eval) forbids inline handlers and hx-on attributes.
 *
 *   data-autosubmit     a select that submits its form when changed
 *   data-enter-clicks   a clickable row that Enter activates too (when it has the focus itself)
 *   .pin-button         turns into "pinned" once its request succeeded
 */
(function () {
  "use strict";

  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el instanceof HTMLElement && el.hasAttribute("data-autosubmit") && el.form) {
      el.form.requestSubmit();
    }
  });

  document.addEventListener("keyup", function (event) {
    var el = event.target;
    // A link inside the row handles its own Enter: only the row's own focus counts.
    if (event.key === "Enter" && el instanceof HTMLElement && el.hasAttribute("data-enter-clicks")) {
      el.click();
    }
  });

  document.addEventListener("htmx:afterRequest", function (event) {
    var el = event.detail && event.detail.elt;
    if (el instanceof HTMLButtonElement && el.classList.contains("pin-button") && event.detail.successful) {
      el.textContent = "pinned";
      el.disabled = true;
    }
  });
})();

/* A box that scrolls (a long tool output, a wide table on a phone) and holds nothing
 * focusable gets tabindex=0, so a keyboard can reach and scroll it too. Whether it
 * scrolls depends on the width, so this runs again after swaps and resizes. */
(function () {
  "use strict";
  var SELECTOR = "pre, .table-wrap, .turn-list, .page table, .summary, .payload, .pmsg-text, .json, .bars";

  function scrolls(el) {
    var style = getComputedStyle(el);
    var x = /(auto|scroll)/.test(style.overflowX) && el.scrollWidth > el.clientWidth + 1;
    var y = /(auto|scroll)/.test(style.overflowY) && el.scrollHeight > el.clientHeight + 1;
    return x || y;
  }

  function markScrollers() {
    document.querySelectorAll(SELECTOR).forEach(function (el) {
      if (el.hasAttribute("tabindex") && !el.hasAttribute("data-scroll-focus")) return;
      var reachable = el.querySelector("a[href], button, input, select, textarea, [tabindex]") !== null;
      if (scrolls(el) && !reachable) {
        el.setAttribute("tabindex", "0");
        el.setAttribute("data-scroll-focus", "");
      } else if (el.hasAttribute("data-scroll-focus")) {
        el.removeAttribute("tabindex");
        el.removeAttribute("data-scroll-focus");
      }
    });
  }

  var pending = null;
  function soon() {
    if (pending) return;
    pending = setTimeout(function () { pending = null; markScrollers(); }, 50);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", markScrollers);
  else markScrollers();
  document.addEventListener("htmx:afterSettle", soon);
  document.addEventListener("htmx:oobAfterSwap", soon);
  document.addEventListener("click", soon);
  window.addEventListener("resize", soon);
})();

/* A first-visit card ([data-dismiss-key]) stays hidden once its "Hide" button was pressed. */
(function () {
  "use strict";
  document.querySelectorAll("[data-dismiss-key]").forEach(function (card) {
    var key = card.getAttribute("data-dismiss-key");
    var store = null;
    try { store = window.localStorage; } catch (e) { store = null; }
    if (store && store.getItem(key) === "1") { card.hidden = true; return; }
    var button = card.querySelector("[data-dismiss]");
    if (!button) return;
    button.addEventListener("click", function () {
      card.hidden = true;
      if (store) store.setItem(key, "1");
    });
  });
})();

/* A file input with data-max-bytes refuses a file over that size before the form is
 * sent: a browser that starts a large upload the server refuses at its first bytes
 * shows "connection reset" instead of the server's page. The message goes into the
 * element its aria-describedby names last, and the field stays invalid until another
 * file is chosen, so the form is not submitted. */
(function () {
  "use strict";

  function size(bytes) {
    var units = ["bytes", "KB", "MB", "GB"];
    var i = 0;
    while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i += 1; }
    return (i === 0 ? bytes : bytes.toFixed(1)) + " " + units[i];
  }

  document.addEventListener("change", function (event) {
    var input = event.target;
    if (!(input instanceof HTMLInputElement) || input.type !== "file" || !input.hasAttribute("data-max-bytes")) return;
    var limit = Number(input.getAttribute("data-max-bytes"));
    var ids = (input.getAttribute("aria-describedby") || "").split(/\s+/);
    var box = document.getElementById(ids[ids.length - 1]);
    var file = input.files && input.files[0];
    var message = "";
    if (file && limit > 0 && file.size > limit) {
      message = file.name + " is " + size(file.size) + ": this server accepts files of up to " + size(limit) + ".";
    }
    input.setCustomValidity(message);
    if (box) {
      box.textContent = message;
      box.hidden = message === "";
    }
  });
})();
