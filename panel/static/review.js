/* novelbus blind review (STUDY-3): one pair at a time, from /review/<study>/next.
 * The invite token comes from the link's fragment (or query) once, is POSTed for a session
 * cookie and removed from the address bar; nothing here names an arm, a novel or a model:
 * the page shows what the server's blind projection gives, nothing more. */
(function () {
  "use strict";
  const base = location.pathname.replace(/\/+$/, "");
  const $ = (id) => document.getElementById(id);
  let current = null; // the pair shown
  let csrf = "";
  let span = null; // {text: "a"|"b", start, end} in characters (code points) of the server's text

  function show(id, on) { $(id).hidden = !on; }
  function message(text) { $("message").textContent = text; show("message", Boolean(text)); }

  async function call(path, opts) {
    const init = Object.assign({ credentials: "same-origin", headers: {} }, opts || {});
    if (init.body !== undefined) init.headers["Content-Type"] = "application/json";
    if (init.method === "POST" && csrf) init.headers["X-Review-CSRF"] = csrf;
    const r = await fetch(base + path, init);
    let data = {};
    try { data = await r.json(); } catch (e) { data = { error: "the server's answer could not be read" }; }
    return { ok: r.ok, status: r.status, data: data };
  }

  function inviteFromAddress() {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    const query = new URLSearchParams(location.search);
    const invite = fragment.get("invite") || query.get("invite");
    if (invite) history.replaceState(null, "", base); // the token leaves the address bar and the history
    return invite;
  }

  // A DOM position inside a text element as a character offset of the server's text: the
  // UTF-16 length of everything before it, turned into code points (Python's characters).
  function offsetIn(el, node, offset) {
    const range = document.createRange();
    range.selectNodeContents(el);
    range.setEnd(node, offset);
    return Array.from(range.toString()).length;
  }

  function readSelection() {
    const sel = window.getSelection();
    if (!sel || sel.rangeCount === 0 || sel.isCollapsed) return;
    const range = sel.getRangeAt(0);
    for (const letter of ["a", "b"]) {
      const el = $("text-" + letter);
      if (el.contains(range.startContainer) && el.contains(range.endContainer)) {
        const start = offsetIn(el, range.startContainer, range.startOffset);
        const end = offsetIn(el, range.endContainer, range.endOffset);
        if (end > start) {
          span = { text: letter, start: start, end: end };
          const chars = Array.from(current[letter]).slice(start, end).join("");
          $("flag-span").textContent = "Text " + letter.toUpperCase() + ", characters " + start + "–" + end +
            ": “" + (chars.length > 80 ? chars.slice(0, 77) + "…" : chars) + "”";
          $("flag-span").className = "selected";
        }
        return;
      }
    }
  }

  function clearFlag() {
    span = null;
    $("flag-span").textContent = "No passage selected.";
    $("flag-span").className = "muted";
    $("flag-category").value = "";
  }

  function option(value, label) {
    const o = document.createElement("option");
    o.value = value; o.textContent = label;
    return o;
  }

  const LABELS = { "a": "A is better", "b": "B is better", "tie": "Tie", "both-bad": "Both bad" };

  function render(p) {
    current = p;
    clearFlag();
    const ctx = p.context || {};
    $("ctx-goal").textContent = ctx.goal || "";
    $("ctx-conflict").textContent = ctx.conflict || "";
    $("ctx-time").textContent = ctx.timeLocation || "";
    $("ctx-participants").textContent = (ctx.participants || []).join(", ");
    $("ctx-previous").textContent = ctx.previousParagraph || "(the first scene)";
    $("text-a").textContent = p.a;
    $("text-b").textContent = p.b;
    const box = $("criteria");
    box.replaceChildren();
    const flagFor = $("flag-criterion");
    flagFor.replaceChildren();
    const open = p.criteria.filter((c) => !(p.voted || []).includes(c));
    for (const c of open) {
      const fs = document.createElement("fieldset");
      fs.className = "criterion";
      fs.dataset.criterion = c;
      const legend = document.createElement("legend");
      legend.textContent = (p.questions && p.questions[c]) || c;
      fs.appendChild(legend);
      const row = document.createElement("div");
      row.className = "choices";
      fs.appendChild(row);
      for (const choice of p.choices) {
        const label = document.createElement("label");
        label.className = "choice";
        const input = document.createElement("input");
        input.type = "radio"; input.name = "c-" + c; input.value = choice;
        input.dataset.choice = choice;
        label.append(input, " " + (LABELS[choice] || choice));
        row.appendChild(label);
      }
      box.appendChild(fs);
      flagFor.appendChild(option(c, (p.questions && p.questions[c]) || c));
    }
    const cats = $("flag-category");
    if (cats.options.length === 1) for (const cat of p.flagCategories) cats.appendChild(option(cat, cat.replace(/-/g, " ")));
    $("progress").textContent = "pair " + (p.progress.done + 1) + " of " + p.progress.total;
    show("progress", true);
    show("errors", false);
    show("pair", true);
    window.scrollTo(0, 0);
  }

  async function next() {
    const r = await call("/next");
    if (!r.ok) {
      show("pair", false);
      message(r.status === 403 ? "This page opens with your invite link only. " + (r.data.error || "") :
        (r.data.error || "The review could not be loaded."));
      return;
    }
    csrf = r.data.csrf || "";
    message("");
    if (r.data.done) {
      show("pair", false);
      $("progress").textContent = r.data.progress.done + " of " + r.data.progress.total + " reviewed";
      show("progress", true);
      show("done", true);
      return;
    }
    render(r.data);
  }

  async function submit(ev) {
    ev.preventDefault();
    const votes = {};
    const missing = [];
    for (const fs of document.querySelectorAll("#criteria fieldset")) {
      const checked = fs.querySelector("input:checked");
      if (checked) votes[fs.dataset.criterion] = checked.value;
      else missing.push(fs.querySelector("legend").textContent);
    }
    const errors = $("errors");
    if (missing.length) {
      errors.textContent = "Answer every question first: " + missing.join("; ");
      show("errors", true);
      return;
    }
    const body = { pairId: current.pairId, votes: votes };
    const category = $("flag-category").value;
    if (category) {
      if (!span) {
        errors.textContent = "Select the passage of the problem in text A or B first (or choose “no flag”).";
        show("errors", true);
        return;
      }
      body.flag = { criterion: $("flag-criterion").value, category: category, text: span.text,
        start: span.start, end: span.end };
    }
    $("submit").disabled = true;
    try {
      const r = await call("/vote", { method: "POST", body: JSON.stringify(body) });
      if (!r.ok) {
        errors.textContent = r.data.error || "The vote was refused.";
        show("errors", true);
        return;
      }
      await next();
    } finally {
      $("submit").disabled = false;
    }
  }

  async function start() {
    $("pair").addEventListener("submit", submit);
    $("flag-clear").addEventListener("click", clearFlag);
    document.addEventListener("mouseup", readSelection);
    document.addEventListener("keyup", readSelection);
    const invite = inviteFromAddress();
    if (invite) {
      const r = await call("/session", { method: "POST", body: JSON.stringify({ invite: invite }) });
      if (!r.ok && r.status !== 403) { message(r.data.error || "The invite could not be redeemed."); return; }
    }
    await next();
  }

  start();
})();
