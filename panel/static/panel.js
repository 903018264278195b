// novelbus web panel (OPS-2). Plain JavaScript, no dependencies, no CDN.
// Pages are HTML shells; this fills them from /api/... and keeps them live with server-sent
// events (EventSource resumes after a reconnect with Last-Event-ID = the last stream sequence).
"use strict";

(function () {
  const body = document.body;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const page = body.dataset.page;
  const novelId = body.dataset.novel;
  const SPLIT_LABELS = {
    historyChars: "history", toolResultChars: "tool results", packChars: "brief / pack",
    proseEchoChars: "prose echo",
  };

  // --- helpers ------------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  const num = (v) => (v === null || v === undefined ? "n/a" : Number(v).toLocaleString("en"));
  const $ = (id) => document.getElementById(id);

  async function api(path, options) {
    const opts = Object.assign({ headers: {} }, options || {});
    if (opts.method === "POST") opts.headers["X-CSRF-Token"] = csrf;
    const res = await fetch(path, opts);
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    return { ok: res.ok, status: res.status, data };
  }

  // At most one call of `fn` in flight and at most one start per `ms`; calls meanwhile fold into
  // one more run afterwards (a busy novel's event burst costs a few requests, not one per event).
  function throttle(fn, ms) {
    let busy = false, again = false;
    return async function run() {
      if (busy) { again = true; return; }
      busy = true;
      try { await fn(); } catch (e) { /* the next event retries */ }
      await new Promise((resolve) => setTimeout(resolve, ms));
      busy = false;
      if (again) { again = false; run(); }
    };
  }

  function live(url, onEvent) {
    const source = new EventSource(url);
    const badge = $("live");
    badge.hidden = false;
    source.addEventListener("ready", () => { badge.textContent = "live"; badge.className = "live on"; });
    source.addEventListener("novel", (e) => {
      let data = null;
      try { data = JSON.parse(e.data); } catch (err) { return; }
      onEvent(data, e.lastEventId);
    });
    source.onerror = () => { badge.textContent = "reconnecting"; badge.className = "live off"; };
    return source;
  }

  function statusBadge(node, status, reason) {
    node.textContent = status + (reason ? " · " + reason : "");
    node.className = "badge " + status;
  }

  function lengthBar(length) {
    const wrap = el("div", { class: "length" });
    if (!length.band) {
      wrap.append(el("span", {}, num(length.characters) + " characters (unbounded)"));
      return wrap;
    }
    const [lo, hi] = length.band;
    const max = Math.max(hi, length.characters);
    wrap.append(el("meter", { min: 0, max, low: lo, high: hi, optimum: length.target,
      value: length.characters, title: `band ${num(lo)}–${num(hi)}` }));
    wrap.append(el("span", { class: "small" },
      `${num(length.characters)} / band ${num(lo)}–${num(hi)} (target ${num(length.target)})`));
    return wrap;
  }

  // --- novels page --------------------------------------------------------------------------
  function novelsPage() {
    const tbody = document.querySelector("#novels tbody");
    async function load() {
      const res = await api("/api/novels");
      if (!res.ok) return;
      tbody.replaceChildren(...res.data.map((n) => el("tr", { "data-novel": n.novelId },
        el("td", {}, el("a", { href: "/novels/" + encodeURIComponent(n.novelId) }, n.novelId)),
        el("td", {}, n.title),
        el("td", {}, el("span", { class: "badge " + n.status }, n.status)),
        el("td", {}, `${n.writerMode} / ${n.writerShape}`),
        el("td", {}, el("progress", { max: Math.max(1, n.scenes), value: n.scenesDone }),
          el("span", { class: "small" }, ` ${n.scenesDone}/${n.scenes}`)),
        el("td", {}, lengthBar(n.length)),
        el("td", { class: "pausewhy" }, n.pauseReason ? [el("b", {}, n.pauseReason),
          n.pauseDetail ? " " + n.pauseDetail : ""] : ""),
      )));
      $("empty").hidden = res.data.length > 0;
    }
    load();
    live("/api/events", throttle(load, 400));
  }

  // --- create page --------------------------------------------------------------------------
  function createPage() {
    const form = $("create");
    const box = $("errors");
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      box.hidden = true;
      box.replaceChildren();
      $("text").removeAttribute("aria-invalid");
      $("submit").disabled = true;
      try {
        const res = await api("/api/novels", { method: "POST", body: new FormData(form) });
        if (res.status === 201) {
          window.location.assign("/novels/" + encodeURIComponent(res.data.novelId));
          return;
        }
        const errors = (res.data && res.data.errors) ||
          [{ field: null, message: (res.data && res.data.error) || "HTTP " + res.status }];
        box.append(el("p", {}, "Nothing was created. Fix these and try again:"));
        box.append(el("ul", {}, errors.map((x) => el("li", { class: "field-error", "data-field": x.field || "" },
          x.field ? el("code", {}, x.field) : null, x.field ? ": " : null, x.message))));
        box.hidden = false;
        $("text").setAttribute("aria-invalid", "true");
      } finally {
        $("submit").disabled = false;
      }
    });
  }

  // --- novel page ---------------------------------------------------------------------------
  function novelPage() {
    const base = "/api/novels/" + encodeURIComponent(novelId);
    let current = null;
    let chapterShown = null;
    let modePicked = false;

    function flash(text, bad) {
      const f = $("flash");
      f.textContent = text;
      f.className = "flash" + (bad ? " bad" : "");
    }

    function renderChapters(d) {
      $("length").replaceChildren(lengthBar(d.length),
        el("p", { class: "small" }, `scenes ${d.scenesDone}/${d.scenes} finished · ${num(d.commits)} commits`),
        el("progress", { max: Math.max(1, d.scenes), value: d.scenesDone, id: "scene-progress" }));
      $("chapters").replaceChildren(...d.chapters.map((c) => el("div", { class: "chapter" + (c.done ? " done" : "") },
        el("div", { class: "chapter-head" }, el("b", {}, `${c.order}. ${c.title || c.chapterId}`),
          el("span", { class: "small" }, ` ${num(c.characters)} chars`)),
        el("div", { class: "scenes" }, c.scenes.map((s) => el("span", {
          class: "scene " + s.state, title: `${s.sceneId}: ${s.state}, ${s.commits} commit(s), ${num(s.characters)} chars`,
        }, s.sceneId))))));
    }

    function renderCounters(d) {
      const rows = [
        ["turns", `${num(d.counters.turns)} of ${num(d.budgets.maxTurns)}`],
        ["writerRuns", num(d.counters.writerRuns) + " successful delegations"],
        ["writer runs recorded", num(d.writerRunsTotal)],
        ["writerOutputChars", num(d.counters.writerOutputChars) + " (all writer output, incl. retries)"],
        ["consecutive failures", `${d.counters.consecutiveFailures} of ${d.budgets.consecutiveFailureLimit}`],
        ["stall count", `${d.counters.stallCount} of ${d.budgets.stallThresholdTurns}`],
        ["max duration", num(d.budgets.maxDurationMs / 1000) + " s"],
        ["writer dispatch limit", d.budgets.writerDispatchLimit],
        ["external retry", `${d.budgets.externalRetry.maxAttempts} × ${num(d.budgets.externalRetry.backoffMs)} ms`],
        ["outline revision", d.outlineRevision || "—"],
      ];
      $("counters").replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
      $("inflight").textContent = d.inFlight.length
        ? d.inFlight.map((u) => `${u.unitId} (${u.mode}, attempt ${u.attempt})`).join(", ") : "nothing";
      $("runs").querySelector("tbody").replaceChildren(...d.writerRunsRecent.slice().reverse().map((r) =>
        el("tr", { class: r.status }, el("td", {}, el("code", {}, r.runId)), el("td", {}, r.unitId),
          el("td", {}, r.dispatch), el("td", {}, r.mode), el("td", {}, r.status), el("td", {}, r.reason || ""),
          el("td", {}, num(r.outputChars)))));
    }

    function renderChart(usage) {
      const samples = usage.recent, keys = usage.split;
      const W = 760, H = 220, L = 56, B = 28, T = 10;
      const chart = svg("svg", { viewBox: `0 0 ${W} ${H + 30}`, role: "img", class: "usage",
        "aria-label": "raw input per turn, split into history, tool results, brief/pack and prose echo" });
      const max = Math.max(1, ...samples.map((s) => keys.reduce((a, k) => a + (s[k] || 0), 0)));
      const plotW = W - L - 8, plotH = H - B - T;
      for (let i = 0; i <= 4; i++) {
        const y = T + plotH - (plotH * i) / 4;
        chart.append(svg("line", { x1: L, x2: W - 8, y1: y, y2: y, class: "grid" }));
        chart.append(svg("text", { x: L - 6, y: y + 4, class: "axis", "text-anchor": "end" },
          Math.round((max * i) / 4).toLocaleString("en")));
      }
      const n = Math.max(samples.length, 1), slot = plotW / Math.max(n, 10), bw = Math.max(2, slot * 0.7);
      samples.forEach((s, i) => {
        let y = T + plotH;
        const x = L + i * slot + (slot - bw) / 2;
        const g = svg("g", { class: "bar" });
        keys.forEach((k, j) => {
          const h = (plotH * (s[k] || 0)) / max;
          y -= h;
          g.append(svg("rect", { x, y, width: bw, height: Math.max(0, h), class: "s" + j }));
        });
        g.append(svg("title", {}, `turn ${s.turn} ${s.unitId} (${s.mode}): ` +
          keys.map((k) => `${SPLIT_LABELS[k] || k} ${num(s[k] || 0)}`).join(", ")));
        chart.append(g);
      });
      chart.append(svg("text", { x: L, y: H - 6, class: "axis" },
        samples.length ? `turns ${samples[0].turn}–${samples[samples.length - 1].turn} (raw input characters)` : "no usage samples yet"));
      let lx = L;
      keys.forEach((k, j) => {
        chart.append(svg("rect", { x: lx, y: H + 10, width: 12, height: 12, class: "s" + j }));
        chart.append(svg("text", { x: lx + 16, y: H + 21, class: "axis" }, SPLIT_LABELS[k] || k));
        lx += 150;
      });
      $("chart").replaceChildren(chart);
      $("totals").textContent = Object.entries(usage.totals).map(([mode, t]) =>
        `${mode}: ${num(t.samples)} turns, raw input ${num(t.inputChars)} chars, est. ${num(t.estInputTokens)} tokens, ` +
        `window peak ${num(t.windowPeakTokens || 0)}, split: ` +
        keys.map((k) => `${SPLIT_LABELS[k] || k} ${num(t[k] || 0)}`).join(", ") +
        `; bill: ${(usage.bills && usage.bills[mode] && usage.bills[mode].text) || "no prices set for this model (no bill)"}`).join(" · ");
    }

    function renderChapterSelect(d) {
      const select = $("chapter");
      const have = Array.from(select.options).map((o) => o.value).join(",");
      const want = d.chapters.map((c) => c.chapterId).join(",");
      if (have !== want) {
        select.replaceChildren(...d.chapters.map((c) => el("option", { value: c.chapterId },
          `${c.order}. ${c.title || c.chapterId}`)));
      }
    }

    async function loadProse() {
      const chapterId = $("chapter").value;
      if (!chapterId) return;
      const res = await api(base + "/chapters/" + encodeURIComponent(chapterId));
      if (!res.ok) return;
      chapterShown = chapterId;
      const parts = [el("h3", {}, res.data.title || res.data.chapterId)];
      for (const s of res.data.scenes) {
        for (const p of s.paragraphs) parts.push(el("p", {}, p));
      }
      if (parts.length === 1) parts.push(el("p", { class: "muted" }, "nothing committed in this chapter yet"));
      $("prose").replaceChildren(...parts);
    }

    async function load() {
      const res = await api(base);
      if (!res.ok) { flash((res.data && res.data.error) || "could not load", true); return; }
      const d = res.data;
      current = d;
      $("title").textContent = d.title;
      statusBadge($("status"), d.status, d.pauseReason);
      $("modeinfo").textContent = `writer mode ${d.writerMode} · shape ${d.writerShape}`;
      const pause = $("pause");
      pause.hidden = !d.pauseReason;
      pause.textContent = d.pauseReason ? `Paused: ${d.pauseReason}${d.pauseDetail ? " — " + d.pauseDetail : ""}` : "";
      $("btn-pause").disabled = d.status !== "active";
      $("btn-stop").disabled = d.status === "finished";
      $("btn-resume").disabled = d.status !== "paused";
      // a live refresh must not undo a mode the operator picked but has not switched to yet
      if (!modePicked && document.activeElement !== $("mode")) $("mode").value = d.writerMode;
      renderChapters(d);
      renderCounters(d);
      renderChart(d.usage);
      renderChapterSelect(d);
      if (chapterShown === null || chapterShown === $("chapter").value) loadProse();
    }

    const refresh = throttle(load, 300);
    const feed = $("feed");
    live(base + "/events", (e, seq) => {
      const rest = Object.entries(e).filter(([k]) => k !== "type" && k !== "novelId")
        .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
      feed.prepend(el("li", { "data-seq": seq, class: "ev " + String(e.type).replace(/\./g, "-") },
        el("span", { class: "seq" }, "#" + seq), " ", el("b", {}, e.type), " ", el("span", { class: "small" }, rest)));
      while (feed.children.length > 200) feed.lastChild.remove();
      refresh();
      if (live_hook) live_hook(e);
    });

    document.querySelectorAll("#controls button[data-action]").forEach((b) => {
      b.addEventListener("click", async () => {
        const res = await api(`${base}/${b.dataset.action}`, { method: "POST" });
        flash(res.ok ? `${b.dataset.action}: ${res.data.status}${res.data.pauseReason ? " (" + res.data.pauseReason + ")" : ""}`
          : (res.data && res.data.error) || "HTTP " + res.status, !res.ok);
        load();
      });
    });
    $("mode").addEventListener("change", () => { modePicked = true; });
    $("btn-mode").addEventListener("click", async () => {
      const mode = $("mode").value;
      const res = await api(base + "/mode", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ mode }) });
      modePicked = false;
      flash(res.ok ? `writer mode ${mode} from the next unit` : (res.data && res.data.error) || "HTTP " + res.status, !res.ok);
      load();
    });
    $("chapter").addEventListener("change", loadProse);
    load();
    steeringPanel(base);
  }

  // --- steering section of the novel page (PLAN-1..5) ---------------------------------------
  // Outline revision (compare-and-set), revisions, directives and config, all over the driver's
  // novelbus.cmd.steer through the panel's API. Directive text goes in POST bodies only.
  const STEER_EVENTS = /^(outline\.|requirement\.|novel\.(config-changed|paused|resumed|finished))/;
  let live_hook = null;

  function showErrors(box, errors, intro) {
    box.replaceChildren();
    if (!errors || !errors.length) { box.hidden = true; return; }
    if (intro) box.append(el("p", {}, intro));
    box.append(el("ul", {}, errors.map((x) => el("li", { class: "field-error", "data-field": x.field || "" },
      x.field ? el("code", {}, x.field) : null, x.field ? ": " : null, x.message))));
    box.hidden = false;
  }
  function errorsOf(res) {
    return (res.data && res.data.errors) ||
      [{ field: null, message: (res.data && res.data.error) || "HTTP " + res.status }];
  }
  function messageId() {
    const b = new Uint8Array(8);
    crypto.getRandomValues(b);
    return "panel-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }
  function warnings(node, list) {  // preflight warnings (PLAN-5) beside a result
    if (list && list.length) node.append(el("span", { class: "warn" }, " · warning: " + list.join("; ")));
  }
  const shown = (v) => (typeof v === "string" ? v : JSON.stringify(v));

  function steeringPanel(base) {
    let prefilled = "";        // the expected revision we filled in (replaced while untouched)
    let outlineJson = "";
    let configShown = {};      // path -> value shown in the config form
    let steerClosed = false;

    function leaves(obj, prefix, out) {
      for (const [k, v] of Object.entries(obj)) {
        const path = prefix + k;
        if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) leaves(v, path + ".", out);
        else out.push([path, v]);
      }
      return out;
    }
    function configDirty() {
      return Array.from(document.querySelectorAll("#config-fields input")).some(
        (i) => i.value !== shown(configShown[i.dataset.path]));
    }
    function renderConfig(config, force) {
      if (!force && (configDirty() || $("config-fields").contains(document.activeElement))) return;
      configShown = {};
      $("config-fields").replaceChildren(...leaves(config, "", []).map(([path, v]) => {
        configShown[path] = v;
        const id = "cfg-" + path.replace(/\./g, "-");
        return el("tr", { "data-path": path }, el("th", {}, el("label", { for: id }, path)),
          el("td", {}, el("input", { id, "data-path": path, value: shown(v), autocomplete: "off", spellcheck: "false" }),
            el("div", { class: "field-note", "data-field": path, hidden: true })));
      }));
    }
    function markConfigErrors(errors) {
      document.querySelectorAll("#config-fields .field-note").forEach((n) => { n.hidden = true; n.textContent = ""; });
      document.querySelectorAll("#config-fields input").forEach((i) => i.removeAttribute("aria-invalid"));
      for (const x of errors || []) {
        const row = x.field && document.querySelector(`#config-fields tr[data-path="${CSS.escape(x.field)}"]`);
        if (!row) continue;
        row.querySelector("input").setAttribute("aria-invalid", "true");
        const note = row.querySelector(".field-note");
        note.textContent = x.message;
        note.hidden = false;
      }
    }

    function renderRequirements(ledger) {
      $("watermark").textContent = ledger.watermark;
      $("requirements-empty").hidden = ledger.requirements.length > 0;
      $("requirements").querySelector("tbody").replaceChildren(...ledger.requirements.map((r) => {
        const detail = r.status === "applied" ? ["in ", el("code", {}, r.appliedRevision || "")]
          : r.status === "blocked" ? [r.blockedReason || ""]
          : r.status === "superseded" ? ["by ", r.supersededBy || ""] : ["holds new units"];
        if (r.resolvedConflict) detail.push(` (resolved by ${r.resolvedConflict.resolvedBy.kind})`);
        return el("tr", { "data-requirement": r.requirementId, class: "req " + r.status },
          el("td", {}, el("code", {}, r.requirementId)), el("td", {}, el("span", { class: "badge " + r.status }, r.status)),
          el("td", { class: "directive-text" }, r.text), el("td", { class: "small" }, detail));
      }));
    }

    async function loadSteering() {
      const res = await api(base + "/steering");
      const warn = $("steer-unavailable");
      if (!res.ok) {
        warn.textContent = (res.data && res.data.error) || "steering is unavailable (HTTP " + res.status + ")";
        warn.hidden = false;
        return;
      }
      warn.hidden = true;
      const { outline, revisions, requirements, config } = res.data;
      $("outline-revision").textContent = outline.revision || "none";
      $("outline-seq").textContent = `#${outline.seq} · ${outline.status}` +
        (outline.plannedChapters ? ` · planned chapters ${outline.plannedChapters}` : "");
      $("outline-awaiting").textContent = outline.awaiting
        ? `waiting for planning: ${outline.awaiting} (next chapter order ${outline.nextChapterOrder})` : "";
      outlineJson = JSON.stringify(outline.outline, null, 2);
      $("outline-json").textContent = outlineJson;
      const expect = $("expect");
      if (expect.value === prefilled) { expect.value = outline.revision || ""; prefilled = expect.value; }
      $("revisions").querySelector("tbody").replaceChildren(...revisions.revisions.slice().reverse().map((r) =>
        el("tr", { "data-revision": r.revision, class: r.revision === revisions.current ? "current" : "" },
          el("td", {}, r.seq), el("td", {}, el("code", {}, r.revision)), el("td", { class: "small" },
            r.createdAt.slice(0, 19).replace("T", " ")), el("td", {}, r.chapters), el("td", {}, r.scenes),
          el("td", { class: "small" }, r.reason))));
      renderRequirements(requirements);
      renderConfig(config, false);
      steerClosed = outline.status === "finished";  // a finished novel's outline, ledger and config are closed
      ["btn-revise", "btn-direct", "btn-config"].forEach((id) => { $(id).disabled = steerClosed; });
    }
    const refreshSteering = throttle(loadSteering, 300);
    live_hook = (e) => { if (STEER_EVENTS.test(String(e.type))) refreshSteering(); };

    $("btn-copy-outline").addEventListener("click", () => { $("layers").value = outlineJson; });

    $("revise").addEventListener("submit", async (e) => {
      e.preventDefault();
      const box = $("revise-errors");
      showErrors(box, []);
      $("revise-result").textContent = "";
      ["layers", "expect"].forEach((id) => $(id).removeAttribute("aria-invalid"));
      $("btn-revise").disabled = true;
      try {
        const res = await api(base + "/revise", { method: "POST", body: new FormData($("revise")) });
        if (res.ok) {
          const r = res.data;
          $("revise-result").className = "flash";
          $("revise-result").textContent = `revision ${r.revision} (#${r.seq}): ${r.chapters} chapters, ${r.scenes} scenes` +
            (r.supersededUnits.length ? `; superseded ${r.supersededUnits.join(", ")}` : "") +
            (r.applied.length ? `; applied ${r.applied.join(", ")}` : "") + (r.resumed ? "; resumed" : "");
          warnings($("revise-result"), r.warnings);
          $("expect").value = r.revision;
          prefilled = r.revision;
          $("layers").value = "";
          $("layers-file").value = "";
          loadSteering();
          return;
        }
        const errors = errorsOf(res);
        showErrors(box, errors, "Nothing was changed:");
        errors.forEach((x) => { if (x.field === "expect" || x.field === "layers") $(x.field).setAttribute("aria-invalid", "true"); });
        if (res.data && res.data.code === "revision-conflict" && res.data.currentRevision) {
          const cur = res.data.currentRevision;
          const use = el("button", { type: "button", class: "secondary", id: "btn-use-current" },
            `Revise against the current revision ${cur}`);
          use.addEventListener("click", () => { $("expect").value = cur; prefilled = cur; showErrors(box, []);
            $("expect").removeAttribute("aria-invalid"); });
          box.append(el("p", { class: "conflict" }, "The outline changed since you read it: current revision ",
            el("code", { id: "current-revision" }, cur), ". Check it above, then ", use));
        }
      } finally {
        $("btn-revise").disabled = steerClosed;
      }
    });

    $("direct").addEventListener("submit", async (e) => {
      e.preventDefault();
      const box = $("direct-errors");
      showErrors(box, []);
      $("direct-result").textContent = "";
      $("btn-direct").disabled = true;
      try {
        const res = await api(base + "/direct", { method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ text: $("directive").value, messageId: messageId() }) });
        if (res.ok) {
          $("direct-result").className = "flash";
          $("direct-result").textContent = `received as ${res.data.requirementId} (its status is in the table below)` +
            (res.data.duplicate ? " (already received)" : "");
          $("directive").value = "";
          loadSteering();
          return;
        }
        showErrors(box, errorsOf(res), "Not sent:");
      } finally {
        $("btn-direct").disabled = steerClosed;
      }
    });

    $("config").addEventListener("submit", async (e) => {
      e.preventDefault();
      const box = $("config-errors");
      showErrors(box, []);
      markConfigErrors([]);
      const set = {};
      document.querySelectorAll("#config-fields input").forEach((i) => {
        if (i.value !== shown(configShown[i.dataset.path])) set[i.dataset.path] = i.value;
      });
      if (!Object.keys(set).length) {
        $("config-result").className = "flash";
        $("config-result").textContent = "nothing changed";
        return;
      }
      $("btn-config").disabled = true;
      try {
        const res = await api(base + "/config", { method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ set }) });
        if (res.ok) {
          $("config-result").className = "flash";
          $("config-result").textContent = `changed ${res.data.changed.join(", ") || "nothing"}` +
            (res.data.resumed ? "; resumed" : "");
          warnings($("config-result"), res.data.warnings);
          renderConfig(res.data.config, true);
          return;
        }
        const errors = errorsOf(res);
        showErrors(box, errors, "Nothing was changed:");
        markConfigErrors(errors);
      } finally {
        $("btn-config").disabled = steerClosed;
      }
    });

    loadSteering();
  }

  if (page === "novels") novelsPage();
  else if (page === "create") createPage();
  else if (page === "novel") novelPage();
})();
