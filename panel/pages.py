"""HTML shells of the panel's pages. They carry structure only; `static/panel.js` fills them from
the JSON API and keeps them live. No inline script or style (the CSP forbids both)."""

from __future__ import annotations

from html import escape

from novelbus import __version__


def _page(csrf: str, title: str, body: str, *, page: str, novel_id: str = "") -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{escape(csrf)}">
<title>{escape(title)} · novelbus</title>
<link rel="stylesheet" href="/static/panel.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
</head>
<body data-page="{page}" data-novel="{escape(novel_id)}">
<header class="top">
  <a class="brand" href="/">novelbus</a>
  <nav><a href="/">Novels</a><a href="/new">Create</a></nav>
  <span class="live" id="live" title="live updates from the event stream" hidden>connecting</span>
</header>
<main>
{body}
</main>
<footer>novelbus {escape(__version__)} · web panel</footer>
<script src="/static/panel.js"></script>
</body>
</html>
"""


layout = _page  # the page frame, for pages kept in their own modules (panel.context_check)


def novels(csrf: str) -> str:
    body = """<h1>Novels</h1>
<p class="muted">Status, progress against the length band and why a novel paused; updates live.</p>
<table class="novels" id="novels">
  <thead><tr><th>novel</th><th>title</th><th>status</th><th>mode</th><th>scenes</th>
  <th>characters vs. length band</th><th>paused because</th></tr></thead>
  <tbody></tbody>
</table>
<p id="empty" class="muted" hidden>No novels yet. <a href="/new">Create one</a>.</p>"""
    return _page(csrf, "Novels", body, page="novels")


def create(csrf: str) -> str:
    body = """<h1>Create a novel</h1>
<form id="create" class="card" novalidate>
  <p class="muted">A novel file is JSON: <code>{"title", "config", "outline"}</code>. Paste it or choose a
  file; the writer mode and shape below override the file's <code>config</code>.</p>
  <label for="text">Novel JSON</label>
  <textarea id="text" name="text" rows="14" spellcheck="false" placeholder='{"title": "…", "outline": {…}}'></textarea>
  <label for="file">…or upload a file</label>
  <input id="file" name="file" type="file" accept=".json,application/json">
  <div class="row">
    <div><label for="writerMode">Writer mode</label>
      <select id="writerMode" name="writerMode"><option value="">as in the file</option>
      <option value="inline">inline</option><option value="subagent">subagent</option></select></div>
    <div><label for="writerShape">Writer shape</label>
      <select id="writerShape" name="writerShape"><option value="">as in the file</option>
      <option value="W1">W1 (draft)</option><option value="W2">W2 (delegate)</option></select></div>
  </div>
  <div id="errors" class="errors" role="alert" hidden></div>
  <button type="submit" id="submit">Create</button>
</form>"""
    return _page(csrf, "Create", body, page="create")


def novel(csrf: str, novel_id: str) -> str:
    body = f"""<div class="head">
  <h1><span id="title">{escape(novel_id)}</span> <span class="badge" id="status">…</span></h1>
  <p class="muted"><code>{escape(novel_id)}</code> · <span id="modeinfo"></span></p>
  <p id="pause" class="pause" hidden></p>
</div>
<section class="card controls" id="controls" aria-label="steer">
  <button data-action="pause" id="btn-pause">Pause</button>
  <button data-action="resume" id="btn-resume">Resume</button>
  <button data-action="stop" id="btn-stop" class="danger">Stop</button>
  <label for="mode">Writer mode</label>
  <select id="mode"><option value="inline">inline</option><option value="subagent">subagent</option></select>
  <button id="btn-mode">Switch mode</button>
  <a class="button" id="download" href="/novels/{escape(novel_id)}/export.md" download>Download Markdown</a>
  <a class="button" id="verify" href="/novels/{escape(novel_id)}/context">Verify contexts</a>
  <span id="flash" class="flash" role="status"></span>
</section>
<div class="grid">
  <section class="card" aria-labelledby="h-progress">
    <h2 id="h-progress">Progress</h2>
    <div id="length"></div>
    <div id="chapters"></div>
  </section>
  <section class="card" aria-labelledby="h-feed">
    <h2 id="h-feed">Live events</h2>
    <ol id="feed" class="feed" reversed></ol>
  </section>
  <section class="card" aria-labelledby="h-counters">
    <h2 id="h-counters">Budgets and counters</h2>
    <table class="kv" id="counters"></table>
    <h3>In flight</h3><p id="inflight" class="muted">nothing</p>
  </section>
  <section class="card" aria-labelledby="h-runs">
    <h2 id="h-runs">Writer runs</h2>
    <table class="runs" id="runs"><thead><tr><th>run</th><th>unit</th><th>#</th><th>mode</th>
    <th>status</th><th>reason</th><th>output</th></tr></thead><tbody></tbody></table>
  </section>
</div>
<section class="card steer" id="steer" aria-labelledby="h-steer">
  <h2 id="h-steer">Steering <span class="small">outline revisions, directives and config, over
  <code>novelbus.cmd.steer</code> like <code>novelbus novel revise|direct|config</code></span></h2>
  <p id="steer-unavailable" class="errors" role="alert" hidden></p>
  <div class="steer-grid">
    <div class="steer-col">
      <h3>Outline</h3>
      <p>revision <code id="outline-revision">…</code> <span id="outline-seq" class="small"></span>
      <span id="outline-awaiting" class="pausewhy"></span></p>
      <details id="outline-details"><summary>Outline (JSON, read-only)</summary>
        <pre id="outline-json" class="json" tabindex="0"></pre></details>
      <form id="revise" novalidate>
        <h3>Revise the outline</h3>
        <p class="small">The layers to replace (<code>story</code>, <code>chapters</code>, <code>scenes</code>,
        <code>characters</code>, <code>lore</code>, <code>foreshadowing</code>), bare or as
        <code>{{"outline": …}}</code>; omitted layers are carried forward.</p>
        <label for="layers">Layers JSON</label>
        <textarea id="layers" name="layers" rows="8" spellcheck="false" placeholder='{{"chapters": […], "scenes": […]}}'></textarea>
        <div class="row tight">
          <button type="button" id="btn-copy-outline" class="secondary">Copy the current outline here</button>
          <label for="layers-file" class="inline">…or upload a file</label>
          <input id="layers-file" name="file" type="file" accept=".json,application/json">
        </div>
        <div class="row">
          <div><label for="expect">Expected revision</label>
            <input id="expect" name="expect" size="27" spellcheck="false" autocomplete="off"></div>
          <div class="grow"><label for="reason">Reason</label>
            <input id="reason" name="reason" placeholder="revised in the panel" autocomplete="off"></div>
          <div><label for="apply">Applies requirements</label>
            <input id="apply" name="apply" size="12" placeholder="req-1 req-2" autocomplete="off"></div>
        </div>
        <div id="revise-errors" class="errors" role="alert" hidden></div>
        <button type="submit" id="btn-revise">Revise outline</button>
        <span id="revise-result" class="flash" role="status"></span>
      </form>
      <h3>Revisions</h3>
      <table class="revisions" id="revisions"><thead><tr><th>#</th><th>revision</th><th>when (UTC)</th>
      <th>ch.</th><th>sc.</th><th>reason</th></tr></thead><tbody></tbody></table>
    </div>
    <div class="steer-col">
      <form id="direct" novalidate>
        <h3>Directives</h3>
        <label for="directive">A directive, in your words</label>
        <textarea id="directive" name="text" rows="3"></textarea>
        <div id="direct-errors" class="errors" role="alert" hidden></div>
        <button type="submit" id="btn-direct">Send directive</button>
        <span id="direct-result" class="flash" role="status"></span>
      </form>
      <p class="small">Nothing more is written while a directive is pending or blocked; a revision applies it
      (list its id under “Applies requirements”). Watermark <b id="watermark">0</b>.</p>
      <table class="requirements" id="requirements"><thead><tr><th>id</th><th>status</th><th>directive</th>
      <th>detail</th></tr></thead><tbody></tbody></table>
      <p id="requirements-empty" class="small">No directives yet.</p>
      <form id="config" novalidate>
        <h3>Budgets and config</h3>
        <p class="small">Values are JSON (a bare word is a string), validated like create; a novel paused
        for <code>budget</code> goes on once the new budgets allow it.</p>
        <table class="kv config" id="config-fields"></table>
        <div id="config-errors" class="errors" role="alert" hidden></div>
        <button type="submit" id="btn-config">Save config</button>
        <span id="config-result" class="flash" role="status"></span>
      </form>
    </div>
  </div>
</section>
<div class="grid">
  <section class="card wide" aria-labelledby="h-usage">
    <h2 id="h-usage">Usage: last 50 turns, raw input split</h2>
    <div id="chart" class="chart"></div>
    <p id="totals" class="muted"></p>
  </section>
  <section class="card wide" aria-labelledby="h-prose">
    <h2 id="h-prose">Prose (read-only)</h2>
    <label for="chapter">Chapter</label> <select id="chapter"></select>
    <article id="prose" class="prose"></article>
  </section>
</div>"""
    return _page(csrf, novel_id, body, page="novel", novel_id=novel_id)


def login(csrf: str, error: str = "") -> str:
    err = f'<p class="errors" role="alert">{escape(error)}</p>' if error else ""
    body = f"""<h1>Log in</h1>
<form method="post" action="/login" class="card">
  <input type="hidden" name="csrf" value="{escape(csrf)}">
  <label for="token">Panel token</label>
  <input id="token" name="token" type="password" autocomplete="current-password">
  {err}
  <button type="submit">Log in</button>
</form>"""
    return _page(csrf, "Log in", body, page="login")


def not_found(csrf: str, message: str) -> str:
    return _page(csrf, "Not found", f"<h1>Not found</h1><p>{escape(message)}</p>", page="missing")
