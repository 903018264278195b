"""OPS-2: the panel's guards, its event stream resuming from Last-Event-ID, and the commands that
serve it — over plain HTTP against real NATS + PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import pytest

from novelbus import store
from novelbus.app import actions
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.panel.app import field_errors
from novelbus.panel.serve import PanelError, PanelOptions, panel_server, resolve_token
from tests.panel.conftest import Panel

TOKEN = "panel-token-for-tests-0123456789"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _request(url: str, method: str = "GET", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _opener.open(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


async def http(url: str, method: str = "GET", body: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return await asyncio.to_thread(_request, url, method, body, headers)


async def csrf_of(base: str, headers: dict[str, str] | None = None) -> str:
    _, _, page = await http(base, headers=headers)
    m = re.search(rb'name="csrf-token" content="([^"]+)"', page)
    assert m, page[:300]
    return m.group(1).decode()


async def sse_ids(url: str, count: int, last_event_id: str | None = None) -> list[int]:
    """The first `count` SSE ids of a stream, read over a raw connection (as EventSource would)."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    extra = f"Last-Event-ID: {last_event_id}\r\n" if last_event_id else ""
    writer.write(f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode())
    await writer.drain()
    ids: list[int] = []
    try:
        while len(ids) < count:
            line = await asyncio.wait_for(reader.readline(), 10)
            assert line, "stream closed"
            if line.startswith(b"id: "):
                ids.append(int(line[4:].strip()))
    finally:
        writer.close()
    return ids


async def _novel(panel: Panel, *, start: bool) -> str:
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    config = nf.config.model_copy(update={"writerMode": "inline"})
    return await actions.create(panel.rt.ctx, nf.model_copy(update={"config": config}), start=start)


async def test_state_changes_need_a_post_with_the_csrf_token_from_the_same_origin(panel: Panel) -> None:
    """OPS-2"""
    novel_id = await _novel(panel, start=False)  # nothing publishes a notice: it stays active, idle
    pool = panel.rt.ctx.pool
    pause = f"{panel.url}api/novels/{novel_id}/pause"
    csrf = await csrf_of(panel.url)
    host = urlsplit(panel.url).netloc

    assert (await http(pause, "POST", b""))[0] == 403  # no token
    assert (await http(pause, "POST", b"", {"X-CSRF-Token": "guess"}))[0] == 403
    assert (await http(pause, "POST", b"", {"X-CSRF-Token": csrf, "Origin": "http://evil.example"}))[0] == 403
    assert (await http(pause))[0] == 405  # a GET never changes anything
    assert (await store.get_novel(pool, novel_id)).status == "active"
    # DNS rebinding: a page of another site resolved to 127.0.0.1 sends its own Host header.
    assert (await http(panel.url, headers={"Host": "evil.example"}))[0] == 400

    status, _, body = await http(pause, "POST", b"", {"X-CSRF-Token": csrf, "Origin": f"http://{host}"})
    assert status == 200 and json.loads(body)["status"] == "paused"
    # The same as `novelbus novel pause`: the store, and a novel.paused event in the ledger.
    assert (await store.get_novel(pool, novel_id)).pause_reason == "user-request"
    assert [e.type for e in await store.list_events(pool, novel_id)][-1] == "novel.paused"

    mode = f"{panel.url}api/novels/{novel_id}/mode"
    status, _, body = await http(mode, "POST", b'{"mode": "sideways"}', {"X-CSRF-Token": csrf})
    assert status == 400 and b"inline or subagent" in body
    status, _, _ = await http(mode, "POST", b'{"mode": "subagent"}', {"X-CSRF-Token": csrf})
    assert status == 200 and (await store.get_novel(pool, novel_id)).writer_mode == "subagent"
    status, _, body = await http(f"{panel.url}api/novels/n-nope/resume", "POST", b"", {"X-CSRF-Token": csrf})
    assert status == 404 and b"not found" in body

    # Responses forbid framing and inline script; the page carries no prose in its URL.
    _, headers, _ = await http(f"{panel.url}novels/{novel_id}")
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src 'self'" in headers["content-security-policy"]


async def test_events_resume_after_a_reconnect_from_last_event_id(panel: Panel) -> None:
    """OPS-2"""
    novel_id = await _novel(panel, start=False)
    ctx = panel.rt.ctx
    for _ in range(3):  # five events of this novel on the stream: created by the panel's own actions
        await actions.steer(ctx, novel_id, "pause")
        await actions.steer(ctx, novel_id, "resume")
    url = f"{panel.url}api/novels/{novel_id}/events"
    first = await sse_ids(url, 5)
    assert first == sorted(first) and len(set(first)) == 5
    # The browser reconnects with the last id it saw: the stream goes on right after it.
    assert await sse_ids(url, 3, last_event_id=str(first[1])) == first[2:5]
    # The all-novels stream starts from now, and resumes the same way.
    everything = f"{panel.url}api/events"
    assert await sse_ids(everything, 2, last_event_id=str(first[2])) == first[3:5]
    # An id the panel never sent is refused by name (a number past int64 was a 500 from JetStream).
    for bad in ("abc", "99999999999999999999", "-1", "1.5", "²"):
        status, _, body = await http(url, headers={"Last-Event-ID": bad, "Accept": "text/event-stream"})
        assert status == 400 and b"Last-Event-ID" in body, (bad, status)


async def test_a_port_in_use_is_a_panel_error_naming_it(panel: Panel) -> None:
    """OPS-2: uvicorn's own bind failure is a SystemExit(3) that escaped the event loop: `novelbus panel`
    on a busy port printed uvicorn's bare log line and no error of ours. The panel binds first."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(PanelError, match=rf"^the panel could not listen on 127\.0\.0\.1:{port}: "
                                             "Address already in use$"):
            async with panel_server(panel.rt.ctx, PanelOptions(port=port)):
                raise AssertionError("served on a port in use")
    async with panel_server(panel.rt.ctx, PanelOptions(port=port)) as url:  # free again: it serves
        assert (await http(url))[0] == 200


async def test_a_token_guards_the_panel_and_logs_in_by_post(panel: Panel) -> None:
    """OPS-2"""
    with pytest.raises(PanelError, match="needs a token"):
        resolve_token("0.0.0.0", None)
    with pytest.raises(PanelError, match="at least 16"):
        resolve_token("192.0.2.1", "short")
    assert resolve_token("10.1.2.3", TOKEN) == TOKEN and resolve_token("127.0.0.1", None) is None

    async with panel_server(panel.rt.ctx, PanelOptions(port=0, token=TOKEN)) as base:
        status, headers, _ = await http(base)
        assert status == 303 and headers["location"] == "/login"
        assert (await http(base + "api/novels"))[0] == 401
        assert (await http(base + "api/novels", headers={"Authorization": f"Bearer {TOKEN}"}))[0] == 200
        csrf = await csrf_of(base + "login")
        form = f"csrf={csrf}&token=wrong-token-wrong-token".encode()
        ctype = {"Content-Type": "application/x-www-form-urlencoded"}
        assert (await http(base + "login", "POST", form, ctype))[0] == 401
        form = f"csrf={csrf}&token={TOKEN}".encode()
        status, headers, _ = await http(base + "login", "POST", form, ctype)
        assert status == 303
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        session = {"Cookie": cookie.split(";")[0]}
        assert (await http(base, headers=session))[0] == 200
        assert (await http(base + "api/novels", headers=session))[0] == 200


async def test_the_novels_api_says_why_a_novel_paused(panel: Panel) -> None:
    """OPS-2: A budget pause by the driver: reason and detail, as `status` shows them."""
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    budgets = nf.config.budgets.model_copy(update={"maxTurns": 2})
    config = nf.config.model_copy(update={"writerMode": "inline", "budgets": budgets})
    paused = asyncio.get_running_loop().create_future()

    async def on_event(msg: Any) -> None:
        if b'"novel.paused"' in msg.data and not paused.done():
            paused.set_result(True)

    ctx = panel.rt.ctx
    sub = await ctx.nc.subscribe(ctx.subjects.events_of(None), cb=on_event)
    try:
        novel_id = await actions.create(ctx, nf.model_copy(update={"config": config}))
        await asyncio.wait_for(paused, 60)
    finally:
        await sub.unsubscribe()
    status, _, body = await http(panel.url + "api/novels")
    (row,) = json.loads(body)
    assert status == 200 and row["novelId"] == novel_id and row["status"] == "paused"
    assert (row["pauseReason"], row["pauseDetail"]) == ("budget", "maxTurns 2 reached")
    assert row["scenesDone"] == 2 and row["scenes"] == 9 and row["length"]["band"] == [6300, 11700]
    status, _, body = await http(f"{panel.url}api/novels/{novel_id}")
    detail = json.loads(body)
    assert [s["state"] for s in detail["chapters"][0]["scenes"]] == ["done", "done", "pending"]
    assert len(detail["usage"]["recent"]) == 2 and detail["counters"]["turns"] == 2


async def test_an_uploaded_file_that_is_not_utf8_is_refused_by_name(panel: Panel) -> None:
    """OPS-2: A Latin-1 file uploaded to create: a 422 saying so (it was a 500 from the decoder), nothing
    created — the CLI's message, since both read a novel file the same way."""
    csrf = await csrf_of(panel.url)
    boundary = "novelbus-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"novel.json\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + b'{"title": "Caf\xe9"}' + \
        f"\r\n--{boundary}--\r\n".encode()
    before = await store.list_novels(panel.rt.ctx.pool)
    status, _, answer = await http(f"{panel.url}api/novels", "POST", body, {
        "X-CSRF-Token": csrf, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 422, answer
    assert json.loads(answer) == {"created": False, "errors": [
        {"field": None, "message": "not UTF-8 text (invalid continuation byte at byte 14)"}]}
    assert await store.list_novels(panel.rt.ctx.pool) == before


def test_create_errors_name_the_field() -> None:
    """OPS-2"""
    assert field_errors("outline: Value error, scenes[0].participants: unknown character 'x'") == [
        {"field": "outline.scenes[0].participants", "message": "unknown character 'x'"}]
    assert field_errors("title: Field required; not valid JSON: line 1 column 2: oops") == [
        {"field": "title", "message": "Field required"},
        {"field": None, "message": "not valid JSON: line 1 column 2: oops"}]


async def _serve_command(args: list[str], env: dict[str, str]) -> tuple[str, int, str]:
    """Start a serving command, wait for its panel URL, GET it, then Ctrl-C it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        url = ""
        while not url:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert line, (await proc.stderr.read()).decode()
            if m := re.search(r"novelbus panel: (http://127\.0\.0\.1:\d+/)", line):
                url = m.group(1)
        status, _, body = await http(url + "api/novels")
        assert status == 200 and isinstance(json.loads(body), list)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    return url, proc.returncode, err.decode()


async def test_panel_and_up_panel_print_their_url_and_serve_it(panel: Panel, nats_url: str) -> None:
    """OPS-2"""
    dsn = panel.rt.ctx.pool._connect_args[0]  # type: ignore[attr-defined]
    flags = ["--nats-url", nats_url, "--database-url", dsn, "--namespace", panel.rt.ctx.subjects.namespace]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")} | {"COLUMNS": "200"}

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", "panel", "--host", "0.0.0.0", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and "needs a token" in err.decode()

    _, code, err = await _serve_command(["panel", "--port", "0", *flags], env)
    assert code == 130 and "Traceback" not in err, err
    _, code, err = await _serve_command(["up", "--panel", "--panel-port", "0", *flags], env)
    assert code == 130 and "Traceback" not in err, err
