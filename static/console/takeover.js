// The takeover page's two things HTMX does not do itself. No build step, no dependency.
// 1. A refused renewal or claim (409) still replaces the lease panel, so its refusal is read where it happened.
// 2. The lease countdown ticks down from the seconds the server computed on its own clock (never the browser's
//    clock: the browser only counts elapsed seconds), and shows the warning once the lease is about to expire.
(function () {
  "use strict";
  function configure() {
    if (!window.htmx) { return; }
    window.htmx.config.responseHandling = [
      { code: "204", swap: false },
      { code: "[23]..", swap: true },
      { code: "409", swap: true, error: false },
      { code: "[45]..", swap: false, error: true },
    ];
  }
  function tick() {
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var left = parseInt(el.getAttribute("data-seconds"), 10) - 1;
      if (isNaN(left)) { return; }
      el.setAttribute("data-seconds", String(left));
      var shown = el.querySelector("[data-seconds-left]");
      if (shown && left >= 0) { shown.textContent = String(left); }
      var warn = parseInt(el.getAttribute("data-warn"), 10);
      if (left <= warn) {
        el.classList.add("expiring");
        var panel = el.closest("section");
        var warning = panel && panel.querySelector("[data-expiry-warning]");
        if (warning) { warning.hidden = false; }
      }
    });
  }
  document.addEventListener("DOMContentLoaded", configure);
  setInterval(tick, 1000);
})();
