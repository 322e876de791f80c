/*
 * Live Plotly charts for the stability dashboards. No dependencies beyond
 * window.Plotly (static/dashboard/plotly.min.js, served from the Python plotly
 * package).
 *
 * A chart element names a JSON endpoint that answers
 *   {"figure": {"data": [...], "layout": {...}}, "running": true|false}
 * (dashboard/export.py figure_payload). The chart is drawn with Plotly.react,
 * which keeps the user's zoom and legend choices across updates because the
 * server sets a constant layout.uirevision per chart. While "running" is true
 * the endpoint is polled again every intervalMs. When the user zooms, the
 * visible step window is fetched (?start=..&end=..), which the server answers
 * at full resolution when it fits in max_points; autoscale (double-click)
 * goes back to the whole, downsampled run.
 *
 * Usage: <div data-live-chart data-url="/runs/7/charts/kl.json"
 *             data-interval-ms="5000" data-max-points="500"></div>
 * and this script: every such element is attached on DOMContentLoaded, or
 * call DashboardLive.attach(element, url, options) yourself.
 */
(function (root) {
  "use strict";

  var DEFAULTS = {
    intervalMs: 5000,
    maxPoints: 500,
    config: { responsive: true, displaylogo: false },
  };

  /*
   * The x window a plotly_relayout event asks for: [start, end], null for the
   * whole run (autoscale), or undefined when the event did not touch the x
   * range (a legend click, a y-only zoom, a hover).
   */
  function visibleWindow(event) {
    if (!event) return undefined;
    if (event["xaxis.autorange"] === true) return null;
    var range = event["xaxis.range"];
    if (Array.isArray(range) && range.length === 2) {
      return [Number(range[0]), Number(range[1])];
    }
    if ("xaxis.range[0]" in event && "xaxis.range[1]" in event) {
      return [Number(event["xaxis.range[0]"]), Number(event["xaxis.range[1]"])];
    }
    return undefined;
  }

  /* The endpoint URL for a window (steps are integers: widen to whole steps). */
  function chartUrl(base, maxPoints, win, origin) {
    var url = new URL(base, origin || root.location.href);
    url.searchParams.set("max_points", String(maxPoints));
    if (win) {
      url.searchParams.set("start", String(Math.floor(Math.min(win[0], win[1]))));
      url.searchParams.set("end", String(Math.ceil(Math.max(win[0], win[1]))));
    } else {
      url.searchParams.delete("start");
      url.searchParams.delete("end");
    }
    return url.toString();
  }

  function LiveChart(element, url, options) {
    this.element = element;
    this.url = url;
    this.options = Object.assign({}, DEFAULTS, options || {});
    this.window = null; // [start, end] or null for the whole run
    this.running = true; // until the server says otherwise
    this.timer = null;
    this.controller = null;
    this.drawing = false;
    this.bound = false;
    this.stopped = false;
    var self = this;
    this.onVisibility = function () {
      if (root.document.hidden) {
        root.clearTimeout(self.timer);
      } else if (self.running) {
        self.refresh();
      }
    };
    root.document.addEventListener("visibilitychange", this.onVisibility);
  }

  LiveChart.prototype.emit = function (name, detail) {
    this.element.dispatchEvent(new root.CustomEvent(name, { detail: detail }));
  };

  LiveChart.prototype.refresh = async function () {
    if (this.stopped) return;
    root.clearTimeout(this.timer);
    if (this.controller) this.controller.abort(); // a newer window wins
    var controller = new root.AbortController();
    this.controller = controller;
    var payload;
    try {
      var response = await root.fetch(
        chartUrl(this.url, this.options.maxPoints, this.window),
        {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
          signal: controller.signal,
        },
      );
      if (!response.ok) throw new Error("HTTP " + response.status);
      payload = await response.json();
    } catch (err) {
      if (err && err.name === "AbortError") return;
      this.emit("livechart:error", { error: String(err) });
      this.schedule();
      return;
    }
    if (controller !== this.controller || this.stopped) return;
    this.controller = null;
    this.running = Boolean(payload.running);
    this.drawing = true;
    try {
      await root.Plotly.react(
        this.element,
        payload.figure.data,
        payload.figure.layout,
        this.options.config,
      );
    } finally {
      this.drawing = false;
    }
    if (!this.bound) {
      var self = this;
      this.element.on("plotly_relayout", function (event) {
        self.onRelayout(event);
      });
      this.bound = true;
    }
    this.emit("livechart:update", { running: this.running, window: this.window });
    this.schedule();
  };

  LiveChart.prototype.schedule = function () {
    root.clearTimeout(this.timer);
    if (this.running && !this.stopped && !root.document.hidden) {
      var self = this;
      this.timer = root.setTimeout(function () {
        self.refresh().catch(function (err) {
          self.emit("livechart:error", { error: String(err) });
        });
      }, this.options.intervalMs);
    }
  };

  LiveChart.prototype.onRelayout = function (event) {
    if (this.drawing) return; // our own redraw, not the user
    var win = visibleWindow(event);
    if (win === undefined) return;
    this.window = win;
    this.refresh();
  };

  LiveChart.prototype.stop = function () {
    this.stopped = true;
    root.clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    root.document.removeEventListener("visibilitychange", this.onVisibility);
  };

  function attach(element, url, options) {
    var chart = new LiveChart(element, url, options);
    element.liveChart = chart;
    chart.refresh().catch(function (err) {
      chart.emit("livechart:error", { error: String(err) });
    });
    return chart;
  }

  function attachAll(scope) {
    var elements = (scope || root.document).querySelectorAll("[data-live-chart]");
    return Array.prototype.map.call(elements, function (element) {
      var data = element.dataset;
      return attach(element, data.url, {
        intervalMs: Number(data.intervalMs) || DEFAULTS.intervalMs,
        maxPoints: Number(data.maxPoints) || DEFAULTS.maxPoints,
      });
    });
  }

  var api = {
    LiveChart: LiveChart,
    attach: attach,
    attachAll: attachAll,
    visibleWindow: visibleWindow,
    chartUrl: chartUrl,
  };
  root.DashboardLive = api;
  if (typeof module !== "undefined" && module.exports) module.exports = api;

  if (root.document) {
    if (root.document.readyState === "loading") {
      root.document.addEventListener("DOMContentLoaded", function () {
        attachAll();
      });
    } else {
      attachAll();
    }
  }
})(typeof window !== "undefined" ? window : globalThis);
