"""Blind review in the panel (STUDY-3) and a study's report page (STUDY-4).

Reviewer routes (a person invited with `novelbus study invite`; nothing else of the panel opens
to them, and they need no panel login):

    GET  /review/{study}          the review page (a shell: `static/review.js` fills it)
    POST /review/{study}/session  JSON {"invite"}: the one-time invite exchanged for a session cookie
    GET  /review/{study}/next     the reviewer's next pair, blind (`app.studies.next_pair`)
    POST /review/{study}/vote     JSON {"pairId", "votes": {criterion: choice}, "flag"?}

The invite travels once, in a POST body: the page reads it from the link's fragment (or query,
which it strips from the address bar) and the server never reads a URL for it. The session is an
HttpOnly, SameSite=Strict cookie scoped to `/review/{study}`, so a browser sends it to that
study's pages only; it is stored hashed by the study service, so it survives a panel restart.
Reviewer POSTs carry `X-Review-CSRF`, a token derived from the session (an HMAC), given by `next`.

A reviewer's cookie or token is no panel credential: the operator's pages and API answer only the
panel token (`Guard`). An operator's login is no reviewer session either: to review, an operator
invites themselves. Reviewer answers are built from the service's blind projection only; a
refusal's message never names the study id (the reviewer sees "this study").

Operator routes (behind the panel's login like every other operator page):

    GET  /studies/{study}         the report: win share per criterion with its 95 % interval (an
                                  SVG drawn here), agreement, each alias's position bias, judges
    GET  /api/studies/{study}/report  `app.studies.report` as JSON
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from novelbus import __version__, store
from novelbus.app import studies
from novelbus.novel.study import CHOICES, study_from_registration
from novelbus.panel import pages
from novelbus.store import studies as db

COOKIE = "novelbus_review"
CSRF_HEADER = "x-review-csrf"
MAX_BODY = 64 * 1024  # bytes of a review request body
_STUDY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# A refusal's HTTP status: an unknown study or pair 404, a token refused 403, a bad vote 422, a
# study not open for votes 409.
_STATUS: dict[type[store.StoreError], int] = {
    db.StudyNotFound: 404, db.PairNotFound: 404, db.ReviewerRefused: 403, db.VoteRefused: 422,
    db.StudyClosed: 409, db.StudyNotRunning: 409,
}


def _study_id(request: Request) -> str:
    study_id = str(request.path_params["study_id"])
    if not _STUDY_ID.match(study_id):
        raise db.StudyNotFound("this study was not found")
    return study_id


def _ctx(request: Request) -> Any:
    return request.app.state.panel.ctx


def _refusal(e: store.StoreError, study_id: str) -> JSONResponse:
    """The service's refusal for a reviewer: its code and message with the study id left out."""
    message = str(e)
    for named in (f"study {study_id!r}", repr(study_id), study_id):
        message = message.replace(named, "this study")
    return JSONResponse({"error": f"{e.code}: {message}", "code": e.code},
                        status_code=_STATUS.get(type(e), 409))


def review_csrf(session: str) -> str:
    """The CSRF token of a reviewer session: only a page that could read `next` knows it."""
    return hmac.new(session.encode(), b"novelbus-review-csrf", hashlib.sha256).hexdigest()[:32]


def _session(request: Request) -> str:
    return request.cookies.get(COOKIE, "")


async def _body(request: Request) -> dict[str, Any] | JSONResponse:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return JSONResponse({"error": "send the request as application/json"}, status_code=415)
    raw = await request.body()
    if len(raw) > MAX_BODY:
        return JSONResponse({"error": f"request body over {MAX_BODY} bytes"}, status_code=413)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
    return body


# --- the reviewer's ------------------------------------------------------------------------------
def review_page() -> str:
    """The review page's shell: no study id, title or name in it; `review.js` fills it."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Blind review · novelbus</title>
<link rel="stylesheet" href="/static/review.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
</head>
<body data-page="review">
<header class="top"><span class="brand">novelbus</span><span class="what">Blind review</span>
  <span class="progress" id="progress" hidden></span></header>
<main>
<p id="message" class="pause" role="alert" hidden></p>
<section id="done" class="card" hidden><h1>Thank you</h1>
  <p>You have reviewed every pair of this study. You can close this page.</p></section>
<form id="pair" hidden novalidate>
  <section class="card" aria-labelledby="h-context"><h2 id="h-context">The scene both texts write</h2>
    <table class="kv"><tbody>
      <tr><th>Goal</th><td id="ctx-goal"></td></tr>
      <tr><th>Conflict</th><td id="ctx-conflict"></td></tr>
      <tr><th>Time and place</th><td id="ctx-time"></td></tr>
      <tr><th>Participants</th><td id="ctx-participants"></td></tr>
    </tbody></table>
    <h3>The previous scene ends</h3><blockquote id="ctx-previous" class="previous"></blockquote>
  </section>
  <div class="texts">
    <section class="card text-card"><h2>Text A</h2><div class="text" id="text-a" data-text="a"></div></section>
    <section class="card text-card"><h2>Text B</h2><div class="text" id="text-b" data-text="b"></div></section>
  </div>
  <section class="card" aria-labelledby="h-votes"><h2 id="h-votes">Which text is better?</h2>
    <div id="criteria"></div>
  </section>
  <section class="card" aria-labelledby="h-flag"><h2 id="h-flag">Flag a problem (optional)</h2>
    <p class="muted">Select the passage in text A or B with the mouse, then name the kind of problem.</p>
    <p id="flag-span" class="muted">No passage selected.</p>
    <div class="row">
      <div><label for="flag-category">Category</label><select id="flag-category"><option value="">no flag</option></select></div>
      <div><label for="flag-criterion">For the question</label><select id="flag-criterion"></select></div>
      <div><button type="button" id="flag-clear" class="secondary">Clear the flag</button></div>
    </div>
  </section>
  <div id="errors" class="errors" role="alert" hidden></div>
  <button type="submit" id="submit">Submit and continue</button>
</form>
</main>
<footer>novelbus {escape(__version__)} · blind review</footer>
<script src="/static/review.js"></script>
</body>
</html>
"""


async def page_review(request: Request) -> Response:
    return HTMLResponse(review_page())


async def api_session(request: Request) -> Response:
    """Redeem a one-time invite for this study's session cookie; the invite is refused after."""
    try:
        study_id = _study_id(request)
    except db.StudyNotFound as e:
        return JSONResponse({"error": f"{e.code}: {e}"}, status_code=404)
    body = await _body(request)
    if isinstance(body, JSONResponse):
        return body
    invite = body.get("invite")
    if not isinstance(invite, str) or not invite:
        return JSONResponse({"error": "invite: the token of your invite link is missing"}, status_code=400)
    try:
        session = await studies.redeem_invite(_ctx(request), study_id, invite)
    except store.StoreError as e:
        return _refusal(e, study_id)
    response = JSONResponse({"ok": True})
    response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path=f"/review/{study_id}")
    return response


async def api_next(request: Request) -> Response:
    """The next pair as the service projects it (blind), and the session's CSRF token."""
    try:
        study_id = _study_id(request)
        nxt = await studies.next_pair(_ctx(request), study_id, _session(request) or "-")
    except store.StoreError as e:
        return _refusal(e, str(request.path_params["study_id"]))
    allowed = ("pairId", "criteria", "questions", "voted", "context", "a", "b", "progress", "choices",
               "flagCategories", "done")
    out = {k: nxt[k] for k in allowed if k in nxt}  # the service's blind fields, nothing added
    out["csrf"] = review_csrf(_session(request))
    return JSONResponse(out)


def _span(flag: Any) -> tuple[str, str, str, tuple[int, int]] | str:
    """A flag {criterion, category, text, start, end} read, or what is wrong with it."""
    if not isinstance(flag, dict):
        return "flag: an object {criterion, category, text, start, end}"
    criterion, category, text = flag.get("criterion"), flag.get("category"), flag.get("text")
    start, end = flag.get("start"), flag.get("end")
    if not all(isinstance(v, str) for v in (criterion, category, text)):
        return "flag: criterion, category and text (a or b) are strings"
    if not (isinstance(start, int) and isinstance(end, int)) or isinstance(start, bool) or isinstance(end, bool):
        return "flag: start and end are character offsets (integers)"
    return str(criterion), str(category), str(text), (start, end)


async def api_vote(request: Request) -> Response:
    """A pair's votes, one per criterion, through the service (append-only, idempotent). The
    flagged criterion is voted first, so a refused flag writes nothing; every other vote's
    criterion and choice are checked before any is written."""
    try:
        study_id = _study_id(request)
    except db.StudyNotFound as e:
        return JSONResponse({"error": f"{e.code}: {e}"}, status_code=404)
    session = _session(request)
    if not session or not hmac.compare_digest(request.headers.get(CSRF_HEADER, ""), review_csrf(session)):
        return JSONResponse({"error": "missing or wrong review CSRF token; reload the page"}, status_code=403)
    body = await _body(request)
    if isinstance(body, JSONResponse):
        return body
    pair_id, votes, flag = body.get("pairId"), body.get("votes"), body.get("flag")
    if not isinstance(pair_id, str) or not pair_id:
        return JSONResponse({"error": "pairId: missing"}, status_code=422)
    if not isinstance(votes, dict) or not votes or not all(isinstance(v, str) for v in votes.values()):
        return JSONResponse({"error": 'votes: an object {criterion: "a" | "b" | "tie" | "both-bad"}'},
                            status_code=422)
    ctx = _ctx(request)
    try:
        await studies.authenticate(ctx, study_id, session)
        # Checked here too, so that no vote of the batch is written before a bad one.
        row = await db.get_study(ctx.pool, study_id)
        registered = study_from_registration(row.registration or row.draft).file.criteria
        for criterion, choice in votes.items():
            if criterion not in registered:
                return JSONResponse({"error": f"vote-refused: criterion {criterion[:40]!r} is not registered "
                                              f"for this study (one of: {', '.join(registered)})"}, status_code=422)
            if choice not in CHOICES:
                return JSONResponse({"error": f"vote-refused: choice {choice[:20]!r} is not one of: "
                                              f"{', '.join(CHOICES)}"}, status_code=422)
        order = list(votes)
        parsed: tuple[str, str, str, tuple[int, int]] | None = None
        if flag is not None:
            got = _span(flag)
            if isinstance(got, str):
                return JSONResponse({"error": f"vote-refused: {got}"}, status_code=422)
            parsed = got
            if parsed[0] not in votes:
                return JSONResponse({"error": "vote-refused: flag.criterion: vote on that question to flag a problem "
                                              "under it"}, status_code=422)
            order = [parsed[0], *(c for c in votes if c != parsed[0])]
        recorded: dict[str, bool] = {}
        for criterion in order:
            extra: dict[str, Any] = {}
            if parsed is not None and criterion == parsed[0]:
                extra = {"flag": parsed[1], "text": parsed[2], "span": parsed[3]}
            done = await studies.vote(ctx, study_id, pair_id, session, criterion=criterion,
                                      choice=votes[criterion], **extra)
            recorded[criterion] = bool(done["recorded"])
    except store.StoreError as e:
        return _refusal(e, study_id)
    return JSONResponse({"pairId": pair_id, "recorded": recorded})


# --- the operator's ------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else escape(str(value))


def interval_chart(criteria: dict[str, dict[str, Any]], *, line: float) -> str:
    """Per criterion, the win share (a dot) and its 95 % interval (a bar) on 0..1, with the even
    line (0.5) and the rule's not-worse line: an inline SVG (pure; no script, no CDN)."""
    left, width, row, top = 170, 480, 34, 26
    height = top + row * len(criteria) + 30

    def x(v: float) -> float:
        return left + width * max(0.0, min(1.0, float(v)))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="share-chart" class="chart" role="img" '
             f'viewBox="0 0 {left + width + 40} {height}" width="{left + width + 40}" height="{height}">',
             '<title>Win share of the arm under test per criterion, with its 95 % interval</title>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{x(tick):.1f}" y1="{top - 8}" x2="{x(tick):.1f}" y2="{height - 22}" '
                     f'stroke="#e3e6eb"/><text x="{x(tick):.1f}" y="{height - 8}" text-anchor="middle" fill="#667085" font-size="12">{tick:.2f}</text>')
    parts.append(f'<line x1="{x(0.5):.1f}" y1="{top - 8}" x2="{x(0.5):.1f}" y2="{height - 22}" stroke="#667085" stroke-dasharray="4 3"/>')
    parts.append(f'<line x1="{x(line):.1f}" y1="{top - 8}" x2="{x(line):.1f}" y2="{height - 22}" stroke="#b35c00" stroke-dasharray="2 3"/>'
                 f'<text x="{x(line):.1f}" y="{top - 12}" text-anchor="middle" fill="#b35c00" font-size="12">not worse ≥ {line:.2f}</text>')
    for i, (name, row_) in enumerate(criteria.items()):
        y = top + row * i + row / 2
        parts.append(f'<text x="{left - 10}" y="{y + 4:.1f}" text-anchor="end" fill="#1d2330" font-size="12">{escape(name)}</text>')
        if row_.get("low") is not None and row_.get("high") is not None:
            parts.append(f'<line x1="{x(row_["low"]):.1f}" y1="{y:.1f}" x2="{x(row_["high"]):.1f}" y2="{y:.1f}" '
                         f'stroke="#2456c9" stroke-width="6" stroke-linecap="round" stroke-opacity="0.45" class="interval" data-criterion="{escape(name)}" data-low="{row_["low"]}" '
                         f'data-high="{row_["high"]}"/>')
        if row_.get("share") is not None:
            parts.append(f'<circle cx="{x(row_["share"]):.1f}" cy="{y:.1f}" r="5" fill="#2456c9" class="share"/>')
        else:
            parts.append(f'<text x="{left + 4}" y="{y + 4:.1f}" text-anchor="middle" fill="#667085" font-size="12">no decided vote</text>')
    parts.append("</svg>")
    return "".join(parts)


def bias_chart(bias: dict[str, Any]) -> str:
    """Each reviewer alias's share of A votes on 0..1 (0.5: no position bias), an inline SVG."""
    left, width, row, top = 170, 480, 26, 10
    height = top + row * max(1, len(bias)) + 28

    def x(v: float) -> float:
        return left + width * max(0.0, min(1.0, float(v)))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="bias-chart" class="chart" role="img" '
             f'viewBox="0 0 {left + width + 40} {height}" width="{left + width + 40}" height="{height}">',
             "<title>Each reviewer's share of A votes (0.5: no position bias)</title>",
             f'<line x1="{x(0.5):.1f}" y1="{top}" x2="{x(0.5):.1f}" y2="{height - 22}" stroke="#667085" stroke-dasharray="4 3"/>']
    for tick in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{x(tick):.1f}" y="{height - 8}" text-anchor="middle" fill="#667085" font-size="12">{tick:.1f}</text>')
    for i, (alias, value) in enumerate(sorted(bias.items())):
        y = top + row * i + row / 2
        parts.append(f'<text x="{left - 10}" y="{y + 4:.1f}" text-anchor="end" fill="#1d2330" font-size="12">{escape(alias)}</text>')
        if value is not None:
            parts.append(f'<rect x="{min(x(0.5), x(value)):.1f}" y="{y - 7:.1f}" '
                         f'width="{abs(x(value) - x(0.5)):.1f}" height="14" fill="#f28e2b" fill-opacity="0.7" class="bias"/>'
                         f'<circle cx="{x(value):.1f}" cy="{y:.1f}" r="4" fill="#2456c9" class="share"/>')
    parts.append("</svg>")
    return "".join(parts)


def render_report(csrf: str, report: dict[str, Any]) -> str:
    """The report as a page (pure). Operators only: it names the arms and the verdict."""
    study_id, criteria = str(report["studyId"]), report.get("criteria") or {}
    test, base = (report.get("compare") or ["", ""])[:2]
    rows = "".join(
        f'<tr data-criterion="{escape(c)}"><td>{escape(c)}</td><td>{r["wins"]}</td><td>{r["ties"]}</td>'
        f'<td>{r["losses"]}</td><td>{r["bothBad"]}</td><td>{_fmt(r.get("share"))}</td>'
        f'<td>{_fmt(r.get("low"))} – {_fmt(r.get("high"))}</td></tr>' for c, r in criteria.items())
    agreement = report.get("agreement") or {}
    bias = report.get("positionBias") or {}
    bias_rows = "".join(f'<tr data-alias="{escape(a)}"><td>{escape(a)}</td><td class="bias-value">{_fmt(v)}</td></tr>'
                        for a, v in sorted(bias.items()))
    judges = report.get("judges") or {}
    judge_rows = "".join(
        f'<tr><td>{escape(a)}</td><td>{_fmt(j.get("kappa"))}</td><td>{_fmt(j.get("positionConsistency"))}</td>'
        f'<td>{_fmt(j.get("positionBias"))}</td><td>{"counted" if j.get("counted") else "reported, ignored"}</td></tr>'
        for a, j in sorted(judges.items()))
    reasons = "".join(f"<li>{escape(str(r))}</li>" for r in report.get("reasons") or [])
    pairs = report.get("pairs") or {}
    flags = report.get("flags") or {}
    flag_count = sum(len(v) for v in flags.values()) if isinstance(flags, dict) else 0
    body = f"""<div class="head">
  <h1>Study <code>{escape(study_id)}</code> · {escape(str(report.get("title", "")))}
    <span class="badge" id="study-status">{escape(str(report.get("status", "")))}</span></h1>
  <p class="muted">{escape(str(test))} (under test) against {escape(str(base))} ·
    variable <code>{escape(str(report.get("variable", "")))}</code> ·
    the same as <code>novelbus study report {escape(study_id)} --json</code></p>
</div>
<section class="card" aria-labelledby="h-verdict"><h2 id="h-verdict">Verdict:
  <span class="badge" id="verdict">{escape(str(report.get("verdict", "")))}</span></h2>
  <p class="muted" id="evidence">{pairs.get("ready", 0)} pairs ready, {pairs.get("enoughReviewers", 0)} with enough
  reviewers' votes (the rule needs {pairs.get("needed", 0)}) · {report.get("reviewers", 0)} reviewers</p>
  <ul id="reasons">{reasons}</ul>
</section>
<section class="card" aria-labelledby="h-share"><h2 id="h-share">Win share of {escape(str(test))} per criterion</h2>
  {interval_chart(criteria, line=float(report.get("notWorseLine", 0.4)))}
  <table id="criteria-table"><thead><tr><th>criterion</th><th>wins</th><th>ties</th><th>losses</th>
  <th>both bad</th><th>win share</th><th>95 % interval</th></tr></thead><tbody>{rows}</tbody></table>
  <p class="small">{escape(str(report.get("interval", "")))}</p>
</section>
<div class="grid">
<section class="card" aria-labelledby="h-agree"><h2 id="h-agree">Agreement between reviewers</h2>
  <table class="kv" id="agreement"><tbody>
    <tr><th>Cohen's κ (two reviewers)</th><td id="kappa">{_fmt(agreement.get("kappa"), 4)}</td></tr>
    <tr><th>Krippendorff's α (nominal)</th><td id="alpha">{_fmt(agreement.get("alpha"), 4)}</td></tr>
    <tr><th>items rated by two or more</th><td id="agreement-items">{agreement.get("items", 0)}</td></tr>
  </tbody></table>
</section>
<section class="card" aria-labelledby="h-bias"><h2 id="h-bias">Position bias (share of A votes)</h2>
  {bias_chart(bias)}
  <table id="bias"><thead><tr><th>reviewer</th><th>share of A</th></tr></thead><tbody>{bias_rows}</tbody></table>
</section>
</div>
<section class="card" aria-labelledby="h-judges"><h2 id="h-judges">Model judges</h2>
  <table id="judges"><thead><tr><th>judge</th><th>κ with people</th><th>position consistency</th>
  <th>share of A</th><th></th></tr></thead><tbody>{judge_rows or '<tr><td colspan="5">none</td></tr>'}</tbody></table>
  <p class="small">{flag_count} flagged problems; their attribution to the pack: <code>novelbus study report
  {escape(study_id)}</code>.</p>
</section>"""
    return pages.layout(csrf, f"Study {study_id}", body, page="study")


async def _report(request: Request) -> dict[str, Any]:
    study_id = _study_id(request)
    return await studies.report(_ctx(request), study_id)


async def page_report(request: Request) -> Response:
    csrf = request.app.state.panel.csrf
    try:
        report = await _report(request)
    except store.StoreError as e:
        return HTMLResponse(pages.not_found(csrf, str(e)), status_code=_STATUS.get(type(e), 409))
    return HTMLResponse(render_report(csrf, report))


async def api_report(request: Request) -> Response:
    try:
        return JSONResponse(await _report(request))
    except store.StoreError as e:
        return JSONResponse({"error": f"{e.code}: {e}"}, status_code=_STATUS.get(type(e), 409))


def routes() -> list[BaseRoute]:
    """The review and report routes, mounted by `panel.app.create_app`."""
    return [
        Route("/review/{study_id}", page_review, methods=["GET"]),
        Route("/review/{study_id}/session", api_session, methods=["POST"]),
        Route("/review/{study_id}/next", api_next, methods=["GET"]),
        Route("/review/{study_id}/vote", api_vote, methods=["POST"]),
        Route("/studies/{study_id}", page_report, methods=["GET"]),
        Route("/api/studies/{study_id}/report", api_report, methods=["GET"]),
    ]


def is_review_path(path: str) -> bool:
    """A reviewer route: authenticated by its own session cookie, not the panel's login."""
    return path.startswith("/review/")
