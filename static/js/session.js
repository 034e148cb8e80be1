/* The session page: live state over the websocket, the tokens chart, the turn selection.
 *
 * The server pushes whole fragments (htmx out-of-band swaps through the ws
 * extension); this script only
 *   - sends the page's cursor when the socket (re)opens, so it catches up,
 *   - pings every 30 s, so the server keeps it in the session's group,
 *   - draws the chart from the JSON the chart fragment carries,
 *   - marks the turn the flow panel shows in the turn list.
 */
(function () {
  "use strict";
  if (!document.getElementById("live-socket")) return;

  var socket = null;
  var PING_MS = 30000;

  function setState(state, text) {
    var el = document.getElementById("live-state");
    if (el) { el.dataset.state = state; el.textContent = text; }
  }

  function cursor() {
    var stats = document.getElementById("stats");
    return {
      type: "catch_up",
      after: Number(stats ? stats.dataset.turns : 0),
      messages: Number(stats ? stats.dataset.messages : 0)
    };
  }

  // The live fragments this page shows: the server pushes only those, so a
  // pinned turn or another page of a list is never a missing swap target.
  function shown() {
    var names = [];
    document.querySelectorAll("[data-live-fragment]").forEach(function (el) { names.push(el.dataset.liveFragment); });
    return names.sort().join(",");
  }
  var told = null;

  function tellView(force) {
    var now = shown();
    if (!socket || (!force && now === told)) return;
    told = now;
    socket.send(JSON.stringify({ type: "view", fragments: now ? now.split(",") : [] }));
  }

  document.body.addEventListener("htmx:wsOpen", function (event) {
    socket = event.detail.socketWrapper;
    setState("live", "live");
    tellView(true);
    socket.send(JSON.stringify(cursor()));
  });
  document.body.addEventListener("htmx:wsClose", function (event) {
    var code = event.detail.event && event.detail.event.code;
    setState("offline", code >= 4000 ? "not allowed" : "reconnecting");
  });
  document.body.addEventListener("htmx:wsError", function () { setState("offline", "reconnecting"); });
  setInterval(function () {
    if (socket) socket.send(JSON.stringify({ type: "ping" }));
  }, PING_MS);

  /* -- chart ------------------------------------------------------------------- */

  var plot = null;
  var drawn = null;
  var TURN_STEPS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000];

  function chartData() {
    var el = document.getElementById("chart-data");
    if (!el) return null;
    try { return JSON.parse(el.dataset.chart); } catch (e) { return null; }
  }

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  // The turn the panels show when it is not the latest (time travel), as a dashed line.
  function pinnedTurn() {
    var bar = document.getElementById("time-bar");
    return bar && bar.dataset.live === "0" ? Number(bar.dataset.turn) : null;
  }

  function drawPinned(u) {
    var turn = pinnedTurn();
    if (turn == null) return;
    var x = u.valToPos(turn, "x", true);
    if (!isFinite(x)) return;
    var ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = css("--accent") || "#2f5bd3";
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
    ctx.restore();
  }

  function drawCompactions(u) {
    drawPinned(u);
    var data = u._contextlab;
    if (!data || !data.compactions) return;
    var ctx = u.ctx;
    var color = css("--compaction") || "#d9480f";
    ctx.save();
    ctx.setLineDash([]);
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.font = (11 * devicePixelRatio) + "px system-ui, sans-serif";
    var lastLabel = -Infinity;
    data.compactions.forEach(function (c) {
      var x = u.valToPos(c.turn, "x", true);
      var y1 = u.valToPos(c.before, "y", true);
      var y2 = u.valToPos(c.after, "y", true);
      if (!isFinite(x) || !isFinite(y1) || !isFinite(y2)) return;
      ctx.beginPath(); ctx.moveTo(x, y1); ctx.lineTo(x, y2); ctx.stroke();
      var h = 5 * devicePixelRatio;
      ctx.beginPath(); ctx.moveTo(x, y2); ctx.lineTo(x - h, y2 - h); ctx.lineTo(x + h, y2 - h); ctx.closePath(); ctx.fill();
      // A compaction that lost identifiers of the messages it compacted: a red dot and the count.
      if (c.lost) {
        var r = 5 * devicePixelRatio;
        ctx.save();
        ctx.fillStyle = css("--danger") || "#c0392b";
        ctx.beginPath(); ctx.arc(x, y2 + 3 * r, r, 0, 2 * Math.PI); ctx.fill();
        ctx.fillText(c.lost + " lost", x + 1.6 * r, y2 + 3 * r + 4 * devicePixelRatio);
        ctx.restore();
      }
      // Version labels only where they do not run into each other.
      if (c.version && x - lastLabel > 34 * devicePixelRatio) {
        ctx.fillText("v" + c.version, x + 3 * devicePixelRatio, y1 - 4 * devicePixelRatio);
        lastLabel = x;
      }
    });
    ctx.restore();
  }

  // The numbers under the cursor (or of the newest turn), in the card's head.
  function readout(u) {
    var el = document.getElementById("chart-readout");
    var data = u ? u._contextlab : chartData();
    if (!el || !data || !data.turns.length) return;
    var i = u && u.cursor.idx != null ? u.cursor.idx : data.turns.length - 1;
    var lost = (data.compactions || []).filter(function (c) { return c.turn === data.turns[i] && c.lost; })[0];
    el.textContent = "turn " + data.turns[i] + " · before " + data.before[i].toLocaleString() +
      " · sent " + data.sent[i].toLocaleString() + " · threshold " + data.threshold[i].toLocaleString() +
      (lost ? " · " + lost.lost + " identifier" + (lost.lost === 1 ? "" : "s") + " lost at this compaction" : "");
  }

  function size() {
    var box = document.getElementById("chart-canvas");
    return { width: Math.max(320, box.clientWidth), height: 240 };
  }

  function draw() {
    var data = chartData();
    if (!data || typeof uPlot === "undefined") return;
    if (drawn === data.version && plot) return;
    drawn = data.version;
    var series = [data.turns, data.before, data.sent, data.threshold];
    if (plot) {
      plot._contextlab = data;
      plot.setData(series);
      readout(null);
      return;
    }
    var box = document.getElementById("chart-canvas");
    if (!data.turns.length) { box.classList.add("is-empty"); return; }
    box.classList.remove("is-empty");
    var fmt = function (u, values) { return values.map(function (v) { return v == null ? "" : v.toLocaleString(); }); };
    plot = new uPlot({
      width: size().width,
      height: size().height,
      scales: { x: { time: false } },
      legend: { show: false },
      cursor: { drag: { x: true, y: false } },
      axes: [
        // Turns are whole numbers: ticks only at integer steps, however narrow the chart.
        { label: "turn", incrs: TURN_STEPS, values: function (u, values) {
          return values.map(function (v) { return v == null || v % 1 ? "" : v.toLocaleString(); });
        } },
        { label: "tokens", size: 64, values: fmt }
      ],
      series: [
        { label: "turn", value: function (u, v) { return v == null ? "" : "#" + v; } },
        { label: "before the hook", stroke: css("--chart-before") || "#8a94a8", width: 1.5, dash: [5, 4],
          value: function (u, v) { return v == null ? "" : v.toLocaleString(); } },
        { label: "sent", stroke: css("--accent") || "#2f5bd3", width: 2, fill: "rgba(47, 91, 211, 0.08)",
          value: function (u, v) { return v == null ? "" : v.toLocaleString(); } },
        { label: "threshold", stroke: css("--danger") || "#c0392b", width: 1, dash: [8, 5], points: { show: false },
          value: function (u, v) { return v == null ? "" : v.toLocaleString(); } }
      ],
      hooks: { draw: [drawCompactions], setCursor: [readout] }
    }, series, box);
    // Read by the draw hook, which first runs after this (uPlot commits later).
    plot._contextlab = data;
    box._plot = plot;  // for the browser tests, which read the axis ticks
    // A click on the chart shows every panel at the turn under the cursor.
    plot.over.addEventListener("click", function () {
      var idx = plot.cursor.idx;
      var d = plot._contextlab;
      if (idx == null || !d || d.turns[idx] == null) return;
      travelTo(d.turns[idx]);
    });
    readout(null);
  }

  window.addEventListener("resize", function () { if (plot) plot.setSize(size()); });

  /* -- the selected turn --------------------------------------------------------- */

  function travelTo(turn) {
    var bar = document.getElementById("time-bar");
    if (!bar || typeof htmx === "undefined") return;
    htmx.ajax("GET", bar.dataset.atUrl + "?turn=" + encodeURIComponent(turn), { target: "#time-bar", swap: "outerHTML" });
  }

  var pinnedDrawn = null;

  function markSelected() {
    var shown = document.querySelector("#flow-panel [data-turn]");
    var number = shown ? shown.dataset.turn : "";
    var pinned = pinnedTurn();
    if (plot && pinned !== pinnedDrawn) { pinnedDrawn = pinned; plot.redraw(false); }
    document.querySelectorAll("tr.turn-row").forEach(function (row) {
      row.classList.toggle("is-selected", row.dataset.turn === number);
    });
  }

  /* -- tabs: one panel at a time; the address says which -------------------------------- */

  function selectTab(name) {
    var panels = document.querySelectorAll(".tab-panel");
    if (!panels.length) return;
    var found = false;
    panels.forEach(function (p) { if (p.dataset.tab === name) found = true; });
    if (!found) name = panels[0].dataset.tab;
    panels.forEach(function (p) { p.hidden = p.dataset.tab !== name; });
    document.querySelectorAll(".tabs [data-tab]").forEach(function (a) {
      a.setAttribute("aria-selected", a.dataset.tab === name ? "true" : "false");
    });
    // The chart or a list may have been laid out while hidden.
    if (plot) plot.setSize(size());
  }

  // A link to a card inside a panel (#ledger-card, #compaction-card) opens that panel.
  function tabOfHash() {
    var id = decodeURIComponent(location.hash.slice(1));
    if (!id) return null;
    var el = document.getElementById(id);
    var panel = el && el.closest(".tab-panel");
    return panel ? panel.dataset.tab : null;
  }

  document.querySelectorAll(".tabs [data-tab]").forEach(function (a) {
    a.addEventListener("click", function (event) {
      event.preventDefault();
      selectTab(a.dataset.tab);
      history.replaceState(null, "", "#tab-" + a.dataset.tab);
    });
  });
  window.addEventListener("hashchange", function () { var t = tabOfHash(); if (t) selectTab(t); });
  selectTab(tabOfHash() || "flow");

  /* -- time travel: the address says which turn is shown; news of turns that arrive ------- */

  // The server renders ?turn=N pinned at that turn; the address follows the bar, so it can be shared.
  function syncAddress() {
    var bar = document.getElementById("time-bar");
    if (!bar) return;
    var params = new URLSearchParams(location.search);
    if (bar.dataset.live === "0") params.set("turn", bar.dataset.turn);
    else params.delete("turn");
    var query = params.toString();
    var want = location.pathname + (query ? "?" + query : "") + location.hash;
    if (want !== location.pathname + location.search + location.hash) history.replaceState(null, "", want);
  }

  // While an older turn is shown, the live stats keep counting: the bar says so, and how many.
  function noteNewTurns() {
    var bar = document.getElementById("time-bar");
    var stats = document.getElementById("stats");
    var news = document.getElementById("time-bar-news");
    if (!bar || !stats || !news || bar.dataset.live !== "0") return;
    var count = Number(stats.dataset.turns);
    var counted = bar.querySelector("[data-turn-count]");
    var shownCount = counted ? Number(counted.dataset.turnCount) : count;
    if (count <= shownCount) return;
    if (counted) counted.textContent = String(count);
    var scrubber = document.getElementById("scrubber");
    if (scrubber) scrubber.max = String(count);
    var fresh = count - shownCount;
    news.textContent = (fresh === 1 ? "New: turn " + count + " arrived" : "New: turns " + (shownCount + 1) + "–" + count + " arrived") +
      " while you look at turn " + bar.dataset.turn + ".";
    news.hidden = false;
  }

  function refresh() { draw(); markSelected(); tellView(false); noteNewTurns(); syncAddress(); }
  document.body.addEventListener("htmx:afterSettle", refresh);
  document.body.addEventListener("htmx:wsAfterMessage", refresh);
  refresh();
})();
