"""The panel's view of `novelbus context verify` (CTX-12): every freeze of a novel assembled
again, how many were reproduced, and the first differing source of each that was not.

`GET /api/novels/{id}/context-verify` returns the command's JSON object; `GET
/novels/{id}/context` shows it as a page. Both read the store only (ids, counts, source names —
never prose, CTX-5).
"""

from __future__ import annotations

from html import escape
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from novelbus import store
from novelbus.novel.outline import is_valid_id
from novelbus.panel import pages
from novelbus.store.freezes import verify_freezes


async def _report(request: Request) -> dict[str, Any]:
    novel_id = str(request.path_params["novel_id"])
    if not is_valid_id(novel_id):
        raise store.NovelNotFound(f"novel {novel_id!r} not found")
    result = await verify_freezes(request.app.state.panel.ctx.pool, novel_id)
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out


async def api_context_verify(request: Request) -> Response:
    try:
        return JSONResponse(await _report(request))
    except store.NovelNotFound as e:
        return JSONResponse({"error": f"{e.code}: {e}"}, status_code=404)


def render(csrf: str, report: dict[str, Any]) -> str:
    """The verification as a page body (pure)."""
    novel_id = report["novelId"]
    ok = not report["mismatches"]
    scenarios = ", ".join(f"{escape(k)} {v}" for k, v in sorted(report["byScenario"].items())) or "none"
    rows = "".join(
        f"<tr><td><code>{escape(m['unitId'])}</code></td><td>{escape(m['scenario'])}</td><td>{m['asOf']}</td>"
        f"<td><code>{escape(m['source'])}</code></td><td>{escape(m['reason'])}</td></tr>"
        for m in report["mismatches"])
    table = ("" if ok else "<table class=\"runs\" id=\"mismatches\"><thead><tr><th>unit</th><th>scenario</th>"
             f"<th>asOf</th><th>first differing source</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>")
    body = (f"<div class=\"head\"><h1>Context verification <code>{escape(novel_id)}</code></h1>"
            f"<p><a href=\"/novels/{escape(novel_id)}\">back to the novel</a></p></div>"
            f"<section class=\"card\" aria-labelledby=\"h-verify\"><h2 id=\"h-verify\">"
            f"<span class=\"badge\" id=\"verify-result\">{'reproduced' if ok else 'mismatch'}</span> "
            f"<span id=\"verify-counts\">{report['reproduced']} of {report['freezes']}</span> freezes reproduced</h2>"
            f"<p class=\"muted\">{scenarios} · the same as <code>novelbus context verify {escape(novel_id)}</code>"
            f"</p>{table}</section>")
    return pages.layout(csrf, f"Context verification {novel_id}", body, page="context", novel_id=novel_id)


async def page_context_verify(request: Request) -> Response:
    csrf = request.app.state.panel.csrf
    try:
        report = await _report(request)
    except store.NovelNotFound as e:
        return HTMLResponse(pages.not_found(csrf, str(e)), status_code=404)
    return HTMLResponse(render(csrf, report))
