/*
 * Live Plotly charts for the stability dashboards. No dependencies beyond
 * window.Plotly (static/dashboard/plotly.min.js, served from the Python plotly
 * package).
 *
 * A chart element names a JSON endpoint that answers
 *   {"figure": {"data": [...], "layout": {...}}, "running": true|false}
 * (dashboard/charts/export.py figure_payload). The chart is drawn with Plotly.react,
 * which keeps the user's zoom and legend choices across updates because the
 * server sets a constant layout.uirevision per chart. While "running" is true
 * the endpoint is polled again every intervalMs. When the user zooms, the
 * visible step window is fetched (?start=..&end=..), which the server answers
 * at full resolution when it fits in max_points; autoscale (double-click)
 * goes back to the whole, downsampled run.
 *
 * Usage: <div data-live-chart data-url="/runs/7/chart?key=mismatch/kl_k3"
 *             data-interval-ms="5000" data-max-points="500"></div>
 * and this script: every such element is attached on DOMContentLoaded, or
 * call DashboardLive.attach(element, url, options) yourself.
 *
 * Chart groups: charts inside <div data-live-group="<url>"> that carry
 * data-group-key="<metric key>" are fetched together from the group's
 * endpoint, which answers ?keys=a,b&max_points= with
 *   {"charts": {key: {"figure", "running"}}, "running": bool}
 * from ONE metric read (the compare page: 10+ charts of 20 runs). The first
 * chart is asked for alone so that it is drawn before the rest arrive, the
 * others in one request; then the group is polled as one. A chart the user
 * zooms leaves its group and fetches its own window from its data-url.
 * Charts outside groups start once the groups' first charts are drawn, so
 * they do not delay them.
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
      } else if (self.running && !self.group) {
        self.refresh(); // a grouped chart is refreshed by its group
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
    await this.draw(payload);
    this.schedule();
  };

  /* Draw a {"figure", "running"} payload (from this chart's URL or its group's). */
  LiveChart.prototype.draw = async function (payload) {
    this.running = Boolean(payload.running);
    var meta = (payload.figure.layout || {}).meta || {};
    if (meta.placeholder) {
      // Nothing to draw yet (or ever): a plain card with the reason, no empty frame.
      if (this.drawn) root.Plotly.purge(this.element);
      this.drawn = false;
      this.bound = false;
      this.element.classList.add("chart-placeholder");
      this.element.textContent = meta.placeholder;
      this.emit("livechart:update", { running: this.running, window: this.window });
      return;
    }
    if (this.element.classList.contains("chart-placeholder")) {
      this.element.classList.remove("chart-placeholder");
      this.element.textContent = "";
    }
    this.drawn = true;
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
  };

  LiveChart.prototype.schedule = function () {
    root.clearTimeout(this.timer);
    if (this.group) return; // the group polls its charts
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
    // On a time axis (?x=wall|relative) the window is not in steps: Plotly zooms the
    // drawn points in the page and the chart keeps polling whole.
    if (/[?&]x=(wall|relative)\b/.test(this.url)) return;
    var win = visibleWindow(event);
    if (win === undefined) return;
    this.window = win;
    this.group = null; // from now on this chart fetches (and polls) its own window
    this.refresh();
  };

  LiveChart.prototype.stop = function () {
    this.stopped = true;
    root.clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    root.document.removeEventListener("visibilitychange", this.onVisibility);
  };

  /* The group endpoint URL for some of its charts' keys. */
  function groupUrl(base, maxPoints, keys, origin) {
    var url = new URL(base, origin || root.location.href);
    url.searchParams.set("max_points", String(maxPoints));
    url.searchParams.set("keys", keys.join(","));
    return url.toString();
  }

  function LiveGroup(element, url, charts, options) {
    this.element = element;
    this.url = url;
    this.charts = charts;
    this.options = Object.assign({}, DEFAULTS, options || {});
    this.running = true;
    this.timer = null;
    this.stopped = false;
    var self = this;
    charts.forEach(function (chart) {
      chart.group = self;
    });
    this.onVisibility = function () {
      if (root.document.hidden) {
        root.clearTimeout(self.timer);
      } else if (self.running) {
        self.refresh();
      }
    };
    root.document.addEventListener("visibilitychange", this.onVisibility);
  }

  /* The charts still drawn from this group (not zoomed away, not stopped). */
  LiveGroup.prototype.members = function () {
    var self = this;
    return this.charts.filter(function (chart) {
      return chart.group === self && !chart.stopped;
    });
  };

  LiveGroup.prototype.load = async function (charts) {
    if (!charts.length || this.stopped) return;
    var self = this;
    var keys = charts.map(function (chart) {
      return chart.key;
    });
    var payload;
    try {
      var response = await root.fetch(groupUrl(this.url, this.options.maxPoints, keys), {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (!response.ok) throw new Error("HTTP " + response.status);
      payload = await response.json();
    } catch (err) {
      charts.forEach(function (chart) {
        chart.emit("livechart:error", { error: String(err) });
      });
      return;
    }
    this.running = Boolean(payload.running);
    await Promise.all(
      charts.map(function (chart) {
        var body = payload.charts && payload.charts[chart.key];
        // A chart zoomed while this was in flight draws its own window instead.
        return body && chart.group === self && !chart.stopped ? chart.draw(body) : null;
      }),
    );
  };

  /* First chart alone, the rest in one request (both in flight at once). */
  LiveGroup.prototype.start = function () {
    var members = this.members();
    this.firstDrawn = this.load(members.slice(0, 1));
    var self = this;
    return Promise.all([this.firstDrawn, this.load(members.slice(1))]).then(function () {
      self.schedule();
    });
  };

  LiveGroup.prototype.refresh = async function () {
    root.clearTimeout(this.timer);
    await this.load(this.members());
    this.schedule();
  };

  LiveGroup.prototype.schedule = function () {
    root.clearTimeout(this.timer);
    if (this.running && !this.stopped && !root.document.hidden && this.members().length) {
      var self = this;
      this.timer = root.setTimeout(function () {
        self.refresh();
      }, this.options.intervalMs);
    }
  };

  LiveGroup.prototype.stop = function () {
    this.stopped = true;
    root.clearTimeout(this.timer);
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

  function chartOptions(element) {
    return {
      intervalMs: Number(element.dataset.intervalMs) || DEFAULTS.intervalMs,
      maxPoints: Number(element.dataset.maxPoints) || DEFAULTS.maxPoints,
    };
  }

  function attachAll(scope) {
    var base = scope || root.document;
    var grouped = new Set();
    var charts = [];
    var firsts = [];
    Array.prototype.forEach.call(base.querySelectorAll("[data-live-group]"), function (groupEl) {
      var members = Array.prototype.filter.call(
        groupEl.querySelectorAll("[data-live-chart][data-group-key]"),
        function (element) {
          return !grouped.has(element);
        },
      );
      if (!members.length) return;
      var liveCharts = members.map(function (element) {
        grouped.add(element);
        var chart = new LiveChart(element, element.dataset.url, chartOptions(element));
        chart.key = element.dataset.groupKey;
        element.liveChart = chart;
        return chart;
      });
      var group = new LiveGroup(groupEl, groupEl.dataset.liveGroup, liveCharts, chartOptions(members[0]));
      groupEl.liveGroup = group;
      group.start();
      firsts.push(group.firstDrawn);
      charts = charts.concat(liveCharts);
    });
    var single = Array.prototype.filter.call(base.querySelectorAll("[data-live-chart]"), function (element) {
      return !grouped.has(element);
    });
    function startSingles() {
      single.forEach(function (element) {
        charts.push(attach(element, element.dataset.url, chartOptions(element)));
      });
    }
    if (firsts.length) {
      Promise.all(firsts).then(startSingles, startSingles);
    } else {
      startSingles();
    }
    return charts;
  }

  var api = {
    LiveChart: LiveChart,
    LiveGroup: LiveGroup,
    attach: attach,
    attachAll: attachAll,
    visibleWindow: visibleWindow,
    chartUrl: chartUrl,
    groupUrl: groupUrl,
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
