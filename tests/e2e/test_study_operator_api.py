"""A reviewer's token opens no operator page or API (STUDY-3)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from novelbus.actors.runtime import Runtime
from novelbus.app import studies
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.study import parse_study_file
from novelbus.panel.serve import PanelOptions, panel_server

PANEL_TOKEN = "panel-token-for-tests-0123456789"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect to the login page is the refusal itself


_opener = urllib.request.build_opener(_NoRedirect)


def _get(url: str, headers: dict[str, str]) -> int:
    try:
        with _opener.open(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


async def test_a_reviewer_token_is_refused_by_the_operator_api(stack: Runtime) -> None:
    """STUDY-3: the operator's API answers the panel's token and refuses a reviewer's, as a
    bearer token or as a cookie."""
    study = parse_study_file(json.dumps({
        "title": "t", "novel": json.loads(sample_novel_bytes()), "variable": "writerMode",
        "compare": ["subagent", "inline"], "arms": {"inline": {"writerMode": "inline"}, "subagent": {}}}))
    study_id = await studies.create(stack.ctx, study, start_arms=False)
    token = (await studies.invite(stack.ctx, study_id, "frank"))["token"]
    async with panel_server(stack.ctx, PanelOptions(port=0, token=PANEL_TOKEN)) as base:
        for path in ("api/novels", ""):
            for headers in ({"Authorization": f"Bearer {token}"}, {"Cookie": f"novelbus_session={token}"}):
                assert await asyncio.to_thread(_get, base + path, headers) in (303, 401, 403), (path, headers)
        assert await asyncio.to_thread(_get, base + "api/novels", {"Authorization": f"Bearer {PANEL_TOKEN}"}) == 200
