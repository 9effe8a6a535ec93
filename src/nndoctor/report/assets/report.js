// nndoctor HTML report: draws the plots as inline SVG from the JSON embedded in the page.
// No network, no library. Errors are recorded on <body data-errors> so a test (or a person
// with devtools closed) can see them; data-rendered counts the plots drawn.
(function () {
  "use strict";
  var errors = [];
  window.addEventListener("error", function (e) {
    errors.push(String(e.message || e));
    document.body.setAttribute("data-errors", JSON.stringify(errors));
  });

  var SVGNS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                 "#17becf", "#bcbd22", "#7f7f7f"];
  var SEVERITY_COLOR = { error: "#c62828", warning: "#b26a00", info: "#1565c0" };
  var W = 560, H = 230, M = { l: 58, r: 14, t: 12, b: 34 };

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVGNS, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, s, attrs) {
    var t = el("text", Object.assign({ x: x, y: y, "font-size": 11, fill: "#57606a" }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e4 || a < 1e-3) return v.toExponential(0).replace("e+", "e");
    return String(+v.toPrecision(3));
  }
  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    var err = (hi - lo) / n / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var ticks = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
    return ticks;
  }
  function legend(container, items) {
    var box = document.createElement("div");
    box.className = "legend";
    items.forEach(function (it) {
      var s = document.createElement("span");
      s.style.setProperty("--c", it.color);
      s.textContent = it.name;
      box.appendChild(s);
    });
    container.appendChild(box);
  }

  // Line chart: series [{name, steps, values, color}], optional log y, finding markers, band.
  function lineChart(container, opts) {
    var series = opts.series.filter(function (s) { return s.steps.length; });
    var xs = [], ys = [];
    series.forEach(function (s) {
      s.steps.forEach(function (x, i) {
        var y = s.values[i];
        if (y === null || !isFinite(y) || (opts.logY && y <= 0)) return;
        xs.push(x); ys.push(opts.logY ? Math.log10(y) : y);
      });
    });
    (opts.markers || []).forEach(function (m) { xs.push(m.step); });
    if (!ys.length) { container.insertAdjacentHTML("beforeend", '<p class="empty">no data recorded</p>'); return false; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    if (x1 === x0) x1 = x0 + 1;
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (opts.band && opts.logY) { y0 = Math.min(y0, Math.log10(opts.band[0])); y1 = Math.max(y1, Math.log10(opts.band[1])); }
    if (opts.yMin !== undefined) y0 = Math.min(y0, opts.yMin);
    if (opts.yMax !== undefined) y1 = Math.max(y1, opts.yMax);
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    if (opts.logY) { y0 = Math.floor(y0); y1 = Math.ceil(y1); }
    var sx = function (x) { return M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r); };
    var sy = function (y) { return H - M.b - (y - y0) / (y1 - y0) * (H - M.t - M.b); };
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    var yt = opts.logY ? niceTicks(y0, y1, 5).filter(function (t) { return Math.round(t) === t; }) : niceTicks(y0, y1, 5);
    yt.forEach(function (t) {
      el("line", { x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t), stroke: "#eaeef2" }, svg);
      text(svg, M.l - 6, sy(t) + 4, opts.logY ? "1e" + t : fmt(t), { "text-anchor": "end" });
    });
    niceTicks(x0, x1, 6).filter(function (t) { return Math.round(t) === t; }).forEach(function (t) {
      text(svg, sx(t), H - M.b + 15, String(t), { "text-anchor": "middle" });
    });
    text(svg, (M.l + W - M.r) / 2, H - 4, opts.xLabel || "optimizer step", { "text-anchor": "middle" });
    if (opts.yLabel) text(svg, 12, (M.t + H - M.b) / 2, opts.yLabel,
                          { "text-anchor": "middle", transform: "rotate(-90 12 " + (M.t + H - M.b) / 2 + ")" });
    el("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, stroke: "#8c959f" }, svg);
    el("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: "#8c959f" }, svg);
    if (opts.band) {
      var b0 = opts.logY ? Math.log10(opts.band[0]) : opts.band[0], b1 = opts.logY ? Math.log10(opts.band[1]) : opts.band[1];
      el("rect", { x: M.l, width: W - M.l - M.r, y: sy(b1), height: sy(b0) - sy(b1), fill: "#2e7d32", "fill-opacity": 0.07 }, svg);
    }
    var rowEnds = [];  // labels of nearby markers go on separate rows instead of overlapping
    (opts.markers || []).forEach(function (m) {
      var x = sx(m.step), color = SEVERITY_COLOR[m.severity] || "#57606a";
      m.row = 0;
      while (rowEnds[m.row] !== undefined && rowEnds[m.row] > x) m.row++;
      rowEnds[m.row] = x + 34;
      el("line", { x1: x, x2: x, y1: M.t, y2: H - M.b, stroke: color, "stroke-dasharray": "4 3", "stroke-width": 1.2 }, svg);
      var t = text(svg, x + 3, M.t + 10 + 11 * (m.row || 0), m.label, { fill: color, "font-weight": 600 });
      el("title", {}, t).textContent = m.title;
    });
    series.forEach(function (s, k) {
      var color = s.color || PALETTE[k % PALETTE.length], d = "", pen = "M";
      s.steps.forEach(function (x, i) {
        var y = s.values[i];
        if (y === null || !isFinite(y) || (opts.logY && y <= 0)) { pen = "M"; return; }
        d += pen + sx(x).toFixed(1) + "," + sy(opts.logY ? Math.log10(y) : y).toFixed(1);
        pen = "L";
      });
      el("path", { d: d, fill: "none", stroke: color, "stroke-width": 1.6 }, svg);
      if (s.steps.length <= 60) s.steps.forEach(function (x, i) {
        var y = s.values[i];
        if (y === null || !isFinite(y) || (opts.logY && y <= 0)) return;
        var c = el("circle", { cx: sx(x), cy: sy(opts.logY ? Math.log10(y) : y), r: 2.2, fill: color }, svg);
        el("title", {}, c).textContent = s.name + " · step " + x + ": " + fmt(y);
      });
    });
    container.appendChild(svg);
    if (series.length > 1 || opts.alwaysLegend) legend(container, series.map(function (s, k) {
      return { name: s.name, color: s.color || PALETTE[k % PALETTE.length] };
    }));
    return true;
  }

  // Heatmap: rows = layers, columns = steps, colour = log10(value).
  function heatmap(container, layers, label) {
    var names = Object.keys(layers);
    var stepSet = {};
    names.forEach(function (n) { layers[n].steps.forEach(function (s) { stepSet[s] = true; }); });
    var steps = Object.keys(stepSet).map(Number).sort(function (a, b) { return a - b; });
    var logs = [];
    names.forEach(function (n) { layers[n].values.forEach(function (v) { if (v > 0 && isFinite(v)) logs.push(Math.log10(v)); }); });
    if (!names.length || !logs.length) { container.insertAdjacentHTML("beforeend", '<p class="empty">no data recorded</p>'); return false; }
    var lo = Math.min.apply(null, logs), hi = Math.max.apply(null, logs);
    if (hi === lo) hi = lo + 1;
    var left = 150, rowH = Math.max(10, Math.min(22, 200 / names.length)), top = 8;
    var h = top + rowH * names.length + 40, cw = (W - left - 60) / steps.length;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + h, role: "img" });
    var stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    function color(t) {
      t = Math.max(0, Math.min(1, t)) * (stops.length - 1);
      var i = Math.min(stops.length - 2, Math.floor(t)), f = t - i, a = stops[i], b = stops[i + 1];
      return "rgb(" + [0, 1, 2].map(function (j) { return Math.round(a[j] + (b[j] - a[j]) * f); }).join(",") + ")";
    }
    names.forEach(function (n, r) {
      var label = n.length > 22 ? "…" + n.slice(-21) : n;
      text(svg, left - 6, top + r * rowH + rowH * 0.7, label, { "text-anchor": "end", "font-family": "monospace" });
      var col = {};
      layers[n].steps.forEach(function (s, i) { col[s] = layers[n].values[i]; });
      steps.forEach(function (s, c) {
        var v = col[s];
        if (v === undefined) return;
        var fill = v === null || !isFinite(v) ? "#d62728" : v <= 0 ? "#ffffff" : color((Math.log10(v) - lo) / (hi - lo));
        var rect = el("rect", { x: left + c * cw, y: top + r * rowH, width: Math.max(cw, 0.5) + 0.3, height: rowH - 1, fill: fill }, svg);
        el("title", {}, rect).textContent = n + " · step " + s + ": " + (v === null ? "NaN/Inf" : fmt(v));
      });
    });
    var y = top + rowH * names.length + 14;
    text(svg, left, y, "step " + steps[0]);
    text(svg, W - 60, y, "step " + steps[steps.length - 1], { "text-anchor": "end" });
    for (var i = 0; i < 20; i++) el("rect", { x: W - 52, y: top + (19 - i) * (rowH * names.length / 20), width: 12,
                                              height: rowH * names.length / 20 + 0.5, fill: color(i / 19) }, svg);
    text(svg, W - 36, top + 9, "1e" + hi.toFixed(1));
    text(svg, W - 36, top + rowH * names.length, "1e" + lo.toFixed(1));
    text(svg, (left + W - 60) / 2, h - 6, label, { "text-anchor": "middle" });
    container.appendChild(svg);
    return true;
  }

  // Stacked bars: data wait and the rest of each step.
  function stepBars(container, total, wait) {
    if (!total.steps.length) { container.insertAdjacentHTML("beforeend", '<p class="empty">no data recorded</p>'); return false; }
    var waits = {};
    wait.steps.forEach(function (s, i) { waits[s] = wait.values[i] || 0; });
    var maxv = Math.max.apply(null, total.values.map(function (v) { return v || 0; })) || 1;
    var ticks = niceTicks(0, maxv * 1000, 4);
    var top = ticks[ticks.length - 1] / 1000 || maxv;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    var n = total.steps.length, bw = (W - M.l - M.r) / n;
    var sy = function (v) { return H - M.b - v / top * (H - M.t - M.b); };
    ticks.forEach(function (t) {
      el("line", { x1: M.l, x2: W - M.r, y1: sy(t / 1000), y2: sy(t / 1000), stroke: "#eaeef2" }, svg);
      text(svg, M.l - 6, sy(t / 1000) + 4, fmt(t) + " ms", { "text-anchor": "end" });
    });
    total.steps.forEach(function (s, i) {
      var t = total.values[i] || 0, w = Math.min(waits[s] || 0, t), x = M.l + i * bw;
      var a = el("rect", { x: x, width: Math.max(bw - 1, 0.5), y: sy(t), height: sy(w) - sy(t), fill: "#1f77b4" }, svg);
      el("title", {}, a).textContent = "step " + s + ": compute and the rest " + fmt((t - w) * 1000) + " ms";
      var b = el("rect", { x: x, width: Math.max(bw - 1, 0.5), y: sy(w), height: sy(0) - sy(w), fill: "#ff7f0e" }, svg);
      el("title", {}, b).textContent = "step " + s + ": waiting for data " + fmt(w * 1000) + " ms";
    });
    el("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: "#8c959f" }, svg);
    text(svg, M.l, H - M.b + 15, "step " + total.steps[0]);
    text(svg, W - M.r, H - M.b + 15, "step " + total.steps[n - 1], { "text-anchor": "end" });
    container.appendChild(svg);
    legend(container, [{ name: "waiting for the DataLoader", color: "#ff7f0e" }, { name: "the rest of the step", color: "#1f77b4" }]);
    return true;
  }

  function toSeries(obj) {
    return Object.keys(obj).map(function (name) { return { name: name, steps: obj[name].steps, values: obj[name].values }; });
  }

  function draw() {
    var node = document.getElementById("nndoctor-data");
    var data = JSON.parse(node.textContent);
    var h = data.history;
    var drawn = 0;
    function slot(id) { return document.getElementById(id); }
    if (h && slot("plot-loss")) {
      var markers = data.findings.filter(function (f) { return f.first_step !== null; })
        .sort(function (a, b) { return a.first_step - b.first_step; }).map(function (f) {
          return { step: f.first_step, label: f.code, severity: f.severity,
                   title: f.code + " " + f.name + " (first at step " + f.first_step + "): " + f.message };
        });
      drawn += lineChart(slot("plot-loss"), { series: [{ name: "loss", steps: h.loss.steps, values: h.loss.values, color: "#1f2328" }],
                                              markers: markers, yLabel: "loss" });
      drawn += heatmap(slot("plot-grads"), h.grad_norms, "gradient L2 norm per layer (log colour scale)");
      drawn += lineChart(slot("plot-updates"), { series: toSeries(h.update_ratios), logY: true, band: [1e-4, 1e-2],
                                                 yLabel: "‖Δw‖ / ‖w‖", alwaysLegend: true });
      drawn += lineChart(slot("plot-inputs"), { series: toSeries(h.inputs), yLabel: "model input", alwaysLegend: true });
      var act = toSeries(h.dead_fraction).map(function (s) { s.name = s.name + " (ReLU at zero)"; return s; })
        .concat(toSeries(h.saturated_fraction).map(function (s) { s.name = s.name + " (saturated)"; return s; }));
      drawn += lineChart(slot("plot-activations"), { series: act, yLabel: "fraction of outputs", yMin: 0, yMax: 1, alwaysLegend: true });
      drawn += stepBars(slot("plot-steptime"), h.step_time, h.data_wait);
    }
    document.body.setAttribute("data-rendered", String(drawn));
  }

  try { draw(); } catch (e) {
    errors.push(String(e && e.stack || e));
    document.body.setAttribute("data-errors", JSON.stringify(errors));
  }
})();
