// gpumeter dashboard: tooltips for anything with data-tip, and the rental page's metric
// charts (fetched from the console's JSON API, /v1/gpus/{uuid}/metrics, with zoom). No library.
"use strict";

(function tooltips() {
  const tip = document.getElementById("tip");
  if (!tip) return;
  function show(el, x, y) {
    tip.textContent = el.getAttribute("data-tip");
    tip.hidden = false;
    const r = tip.getBoundingClientRect();
    tip.style.left = Math.max(4, Math.min(x + 12, window.innerWidth - r.width - 4)) + "px";
    tip.style.top = Math.max(4, Math.min(y + 14, window.innerHeight - r.height - 4)) + "px";
  }
  const hide = () => { tip.hidden = true; };
  document.addEventListener("mouseover", (e) => {
    const el = e.target.closest && e.target.closest("[data-tip]");
    if (el) show(el, e.clientX, e.clientY); else hide();
  });
  document.addEventListener("mousemove", (e) => {
    const el = e.target.closest && e.target.closest("[data-tip]");
    if (el) show(el, e.clientX, e.clientY);
  });
  document.addEventListener("focusin", (e) => {
    const el = e.target.closest && e.target.closest("[data-tip]");
    if (!el) return hide();
    const r = el.getBoundingClientRect();
    show(el, r.left, r.bottom);
  });
  document.addEventListener("focusout", hide);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") hide(); });
})();

(function metrics() {
  const section = document.querySelector(".metrics");
  if (!section) return;
  const full = [Number(section.dataset.start), Number(section.dataset.end)];
  const tz = section.dataset.tz;
  const pick = document.getElementById("gpu-pick");
  const rangeText = section.querySelector(".range");
  const charts = [...section.querySelectorAll(".chart")];
  // ISO-style local times (2026-10-10 14:00 CEST), as on the rest of the page, whatever the
  // browser's locale: the parts are put together here, not by the locale's pattern.
  const parts = new Intl.DateTimeFormat("en-GB", {
    timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short",
  });
  const when = {
    format(ms, short) {
      const p = Object.fromEntries(parts.formatToParts(ms).map((x) => [x.type, x.value]));
      const day = `${p.year}-${p.month}-${p.day}`;
      return short ? `${p.month}-${p.day} ${p.hour}:${p.minute}` : `${day} ${p.hour}:${p.minute} ${p.timeZoneName}`;
    },
  };
  // Seconds east of UTC at second s in the customer's zone (whole minutes).
  function offsetAt(s) {
    const p = Object.fromEntries(parts.formatToParts(s * 1000).map((x) => [x.type, Number(x.value)]));
    return (Date.UTC(p.year, p.month - 1, p.day, p.hour % 24, p.minute) / 1000) - Math.floor(s / 60) * 60;
  }
  // Tick steps, shortest first: the first that gives at most MAX_TICKS labels is used, and the
  // labels fall on its multiples in local time (14:00, 14:15; never 14:07).
  const TICK_STEPS = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
  const MAX_TICKS = 5;
  function roundTicks(lo, hi) {
    const step = TICK_STEPS.find((s) => (hi - lo) / s <= MAX_TICKS) || TICK_STEPS[TICK_STEPS.length - 1];
    const offset = offsetAt(lo);
    const out = [];
    for (let t = Math.ceil((lo + offset) / step) * step - offset; t < hi; t += step) out.push(t);
    // Not at the very edges, where half a label would hang outside the chart.
    return out.filter((t) => (t - lo) / (hi - lo) > 0.04 && (t - lo) / (hi - lo) < 0.96);
  }
  const MAX_POINTS = 600;
  const MAX_WINDOW = 31 * 86400;
  let range = full.slice();
  let request = 0;

  const iso = (s) => new Date(s * 1000).toISOString();
  // Minute points while the range allows it; coarser steps (whole minutes) beyond.
  const stepFor = (lo, hi) => Math.max(60, Math.ceil((hi - lo) / MAX_POINTS / 60) * 60);

  function clamp(lo, hi) {
    const width = Math.max(300, Math.min(hi - lo, full[1] - full[0], MAX_WINDOW));
    lo = Math.max(full[0], Math.min(lo, full[1] - width));
    return [Math.round(lo), Math.round(lo + width)];
  }

  async function load() {
    const mine = ++request;
    const [lo, hi] = range;
    const step = stepFor(lo, hi);
    rangeText.textContent = `${when.format(lo * 1000)} to ${when.format(hi * 1000)}, ` +
      (step === 60 ? "one point per minute" : `one point per ${step / 60} minutes`);
    charts.forEach((c) => state(c, "loading", "Loading…"));
    const url = `/v1/gpus/${encodeURIComponent(pick.value)}/metrics?start=${iso(lo)}&end=${iso(hi)}&step=${step}`;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`${response.status}`);
      const body = await response.json();
      if (mine !== request) return;
      charts.forEach((c) => draw(c, body.points, lo, hi, step));
    } catch (err) {
      if (mine === request) charts.forEach((c) => state(c, "nodata", `Could not load metrics (${err.message}).`));
    }
  }

  function state(chart, cls, text) {
    const plot = chart.querySelector(".plot");
    plot.replaceChildren();
    const p = document.createElement("p");
    p.className = cls;
    p.textContent = text;
    plot.append(p);
  }

  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  }

  function draw(chart, points, lo, hi, step) {
    const field = chart.dataset.field;
    const unit = chart.dataset.unit;
    const values = points.filter((p) => p[field] !== null);
    if (!values.length) return state(chart, "nodata", "No data in this range.");
    const top = Number(chart.dataset.max) || Math.max(...values.map((p) => p[field])) * 1.1 || 1;
    const W = 1000, H = 100;
    const x = (t) => ((t - lo) / (hi - lo)) * W;
    const y = (v) => H - (v / top) * H;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
    [0.25, 0.5, 0.75].forEach((f) => svg.append(el("line", { class: "grid", x1: 0, x2: W, y1: H * f, y2: H * f })));
    // A gap longer than one step breaks the line: no telemetry is not zero.
    let d = "", last = null;
    for (const p of values) {
      d += `${last === null || p.t_s - last > step ? "M" : "L"}${x(p.t_s).toFixed(2)},${y(p[field]).toFixed(2)}`;
      last = p.t_s;
    }
    svg.append(el("path", { class: "line", d }));
    const plot = chart.querySelector(".plot");
    plot.replaceChildren(svg);
    // Value axis: 0, half and the top, in the chart's unit.
    [0, 0.5, 1].forEach((f) => {
      const label = document.createElement("span");
      label.className = "ylab";
      label.style.top = `${(1 - f) * 100}%`;
      label.textContent = `${Math.round(top * f)} ${unit}`;
      plot.append(label);
    });
    // Time axis: labels at round local times (every other one hidden on a phone, by CSS).
    roundTicks(lo, hi).forEach((t, i) => {
      const label = document.createElement("span");
      label.className = i % 2 ? "xlab alt" : "xlab";
      label.style.left = `${((t - lo) / (hi - lo)) * 100}%`;
      label.textContent = when.format(t * 1000, true);
      plot.append(label);
    });
    plot.dataset.tip = "";
    plot.onmousemove = (e) => {
      const r = plot.getBoundingClientRect();
      const t = lo + ((e.clientX - r.left) / r.width) * (hi - lo);
      const near = values.reduce((a, b) => (Math.abs(b.t_s - t) < Math.abs(a.t_s - t) ? b : a));
      plot.dataset.tip = `${when.format(near.t_s * 1000)}: ${near[field]} ${unit}`;
    };
    dragZoom(plot, svg, lo, hi);
  }

  function dragZoom(plot, svg, lo, hi) {
    let from = null, sel = null;
    const at = (e) => {
      const r = plot.getBoundingClientRect();
      return Math.min(1, Math.max(0, (e.clientX - r.left) / r.width));
    };
    plot.onmousedown = (e) => {
      from = at(e);
      sel = el("rect", { class: "sel", x: from * 1000, y: 0, width: 0, height: 100 });
      svg.append(sel);
    };
    plot.onmouseup = (e) => {
      if (from === null) return;
      const to = at(e);
      const [a, b] = [Math.min(from, to), Math.max(from, to)];
      from = null;
      if (b - a < 0.01) { sel.remove(); return; }
      zoom(lo + a * (hi - lo), lo + b * (hi - lo));
    };
    plot.addEventListener("mousemove", (e) => {
      if (from === null) return;
      const to = at(e);
      sel.setAttribute("x", Math.min(from, to) * 1000);
      sel.setAttribute("width", Math.abs(to - from) * 1000);
    });
  }

  function zoom(lo, hi) { range = clamp(lo, hi); load(); }

  section.querySelectorAll("[data-zoom]").forEach((button) => button.addEventListener("click", () => {
    const [lo, hi] = range, w = hi - lo, mid = (lo + hi) / 2;
    const action = button.dataset.zoom;
    if (action === "in") zoom(mid - w / 4, mid + w / 4);
    if (action === "out") zoom(mid - w, mid + w);
    if (action === "left") zoom(lo - w / 2, hi - w / 2);
    if (action === "right") zoom(lo + w / 2, hi + w / 2);
    if (action === "reset") zoom(full[0], full[1]);
  }));
  pick.addEventListener("change", load);
  // A band piece (click or Enter) zooms the charts to it, on its GPU.
  function focusPiece(piece) {
    pick.value = (piece.dataset.gpu ? piece : piece.closest("[data-gpu]")).dataset.gpu;
    const s = Number(piece.dataset.start), e = Number(piece.dataset.end), pad = Math.max(300, (e - s) / 4);
    zoom(s - pad, e + pad);
  }
  document.querySelectorAll(".band-svg .piece").forEach((piece) => {
    piece.addEventListener("click", () => focusPiece(piece));
    piece.addEventListener("keydown", (e) => { if (e.key === "Enter") focusPiece(piece); });
  });
  // An incident marker (a button: click, Enter or Space) does the same for its incident.
  document.querySelectorAll(".incident").forEach((marker) => marker.addEventListener("click", () => focusPiece(marker)));
  // ?focus=GPU@second (an incident's "Evidence" link): open the charts on that GPU there.
  const focus = new URLSearchParams(location.search).get("focus");
  const [focusGpu, focusAt] = focus ? focus.split("@") : [];
  if (focusGpu && [...pick.options].some((o) => o.value === focusGpu) && Number(focusAt)) {
    pick.value = focusGpu;
    range = clamp(Number(focusAt) - 1800, Number(focusAt) + 3600);
  } else {
    range = clamp(full[0], full[1]);
  }
  load();
})();
