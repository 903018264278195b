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
  <span id="flash" class="flash" role="status"></span>
</section>
<!-- Steering: outline revision and directives (the steering issue) render their forms here. -->
<section class="card" id="steer" hidden></section>
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
