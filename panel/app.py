"""The panel's ASGI app (OPS-2): pages, a JSON API, server-sent events, and the guards.

Routes (novel ids are the only variable part of any URL; prose, tokens and titles never are):

    GET  /                          novels page            GET  /api/novels
    GET  /new                       create page            POST /api/novels           (multipart)
    GET  /novels/{id}               novel page             GET  /api/novels/{id}
    GET  /novels/{id}/export.md     Markdown download      GET  /api/novels/{id}/chapters/{chapterId}
    POST /api/novels/{id}/pause|resume|stop                POST /api/novels/{id}/mode (JSON {"mode"})
    GET  /api/novels/{id}/steering  outline, revisions, requirements, config (over novelbus.cmd.steer)
    POST /api/novels/{id}/revise    (multipart: layers|file, expect, reason, apply)
    POST /api/novels/{id}/direct    (JSON {"text", "messageId"?})   POST /api/novels/{id}/config (JSON {"set"})
    GET  /api/events                SSE, every novel       GET  /api/novels/{id}/events  (SSE)
    GET  /login, POST /login        only when a token is configured
    /review/{study}/…, /studies/{study}, /api/studies/{study}/report   panel.review (STUDY-3, STUDY-4)
    /static/…                       panel.js, panel.css (shipped in the package; no CDN)

Guards (`Guard`): the Host header must name the bound address (no DNS rebinding); with a token,
every route but /login and /static needs the session cookie set by /login or an
`Authorization: Bearer` header; every POST needs the page's CSRF token (`X-CSRF-Token` header,
or the `csrf` field of the login form) and, when the browser sends one, a same-origin `Origin`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from novelbus import store
from novelbus.app import actions
from novelbus.app.billing import prices_for
from novelbus.app.probe import REQUIRED_FOR_SUBAGENT, cached_report, run_probes, save_report
from novelbus.bus.client import BusUnavailable, RemoteError
from novelbus.infra.llama import open_local_server
from novelbus.novel.export import export_markdown
from novelbus.novel.outline import (
    NovelConfig,
    NovelFile,
    OutlineError,
    is_valid_id,
    parse_novel_file,
)
from novelbus.panel import pages, review, views
from novelbus.panel.context_check import api_context_verify, page_context_verify
from novelbus.writers.factory import make_provider
from novelbus.writers.provider import ProviderError

STATIC_DIR = Path(__file__).parent / "static"
COOKIE = "novelbus_panel"
MAX_NOVEL_FILE = 8 * 1024 * 1024  # bytes of JSON a create request may carry
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; "
                                 b"img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                 b"form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class PanelState:
    """What the app needs: a connected context (pool, NATS, subjects, emit) and its guards."""

    ctx: Any  # novelbus.actors.context.ActorContext
    token: str | None = None  # required on any non-loopback bind (see panel.serve)
    allowed_hosts: set[str] | None = None  # None: any Host header (a token guards the panel)
    model: str = "offline"  # the writer model a subagent novel must pass the probes with
    home: Path | None = None  # where the probe cache lives
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    sessions: set[str] = field(default_factory=set)
    closing: asyncio.Event = field(default_factory=asyncio.Event)  # set on shutdown: SSE streams end

    def authenticated(self, headers: dict[str, str], cookies: dict[str, str]) -> bool:
        if self.token is None:
            return True
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer ") and secrets.compare_digest(auth[7:].encode(), self.token.encode()):
            return True
        return cookies.get(COOKIE, "") in self.sessions


def _cookies(raw: str) -> dict[str, str]:
    out = {}
    for part in raw.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            out[name] = value
    return out


class Guard:
    """Host check, authentication, CSRF and security headers around the whole app."""

    def __init__(self, app: ASGIApp, state: PanelState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        method: str = scope["method"]
        host = headers.get("host", "")
        hostname = (urlsplit(f"//{host}").hostname or "").lower()
        if self.state.allowed_hosts is not None and hostname not in self.state.allowed_hosts:
            await self._deny(scope, receive, send, 400, "unexpected Host header")
            return
        if method == "POST":
            origin = headers.get("origin")
            if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
                await self._deny(scope, receive, send, 403, "cross-origin request refused")
                return
            token = headers.get("x-csrf-token", "")
            # A reviewer's POSTs carry their own session's CSRF token (panel.review, STUDY-3).
            if (path != "/login" and not review.is_review_path(path)
                    and not secrets.compare_digest(token.encode(), self.state.csrf.encode())):
                await self._deny(scope, receive, send, 403, "missing or wrong CSRF token; reload the page")
                return
        public = path == "/login" or path.startswith("/static/") or review.is_review_path(path)
        if not public and not self.state.authenticated(headers, _cookies(headers.get("cookie", ""))):
            if method == "GET" and not path.startswith("/api/"):
                await RedirectResponse("/login", status_code=303)(scope, receive, send)
            else:
                await self._deny(scope, receive, send, 401, "log in first (POST /login with the panel token)")
            return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    async def _deny(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        await JSONResponse({"error": message}, status_code=status)(scope, receive, send)


def _state(request: Request) -> PanelState:
    state: PanelState = request.app.state.panel
    return state


def _novel_id(request: Request) -> str:
    novel_id = str(request.path_params["novel_id"])
    if not is_valid_id(novel_id):
        raise store.NovelNotFound(f"novel {novel_id!r} not found")
    return novel_id


def _store_error(e: store.StoreError) -> JSONResponse:
    status = 404 if isinstance(e, store.NovelNotFound) else 409
    return JSONResponse({"error": f"{e.code}: {e}"}, status_code=status)


# --- pages -----------------------------------------------------------------------------------
async def page_novels(request: Request) -> Response:
    return HTMLResponse(pages.novels(_state(request).csrf))


async def page_create(request: Request) -> Response:
    return HTMLResponse(pages.create(_state(request).csrf))


async def page_novel(request: Request) -> Response:
    try:
        novel = await store.get_novel(_state(request).ctx.pool, _novel_id(request))
    except store.NovelNotFound as e:
        return HTMLResponse(pages.not_found(_state(request).csrf, str(e)), status_code=404)
    return HTMLResponse(pages.novel(_state(request).csrf, novel.novel_id))


async def export_md(request: Request) -> Response:
    try:
        novel_id = _novel_id(request)
        text = export_markdown(await store.load_snapshot(_state(request).ctx.pool, novel_id))
    except store.StoreError as e:
        return _store_error(e)
    return Response(text, media_type="text/markdown; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{novel_id}.md"'})


async def login(request: Request) -> Response:
    state = _state(request)
    if state.token is None:
        return RedirectResponse("/", status_code=303)
    if request.method == "GET":
        return HTMLResponse(pages.login(state.csrf))
    form = await request.form()
    csrf, token = str(form.get("csrf", "")), str(form.get("token", ""))
    if not (secrets.compare_digest(csrf.encode(), state.csrf.encode())
            and secrets.compare_digest(token.encode(), state.token.encode())):
        return HTMLResponse(pages.login(state.csrf, error="wrong token"), status_code=401)
    session = secrets.token_urlsafe(32)
    state.sessions.add(session)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
    return response


# --- JSON API --------------------------------------------------------------------------------
async def api_novels(request: Request) -> Response:
    return JSONResponse(await views.novels(_state(request).ctx.pool))


async def api_novel(request: Request) -> Response:
    try:
        state = _state(request)
        prices = None
        with contextlib.suppress(ProviderError):  # SERVE-5: an unreadable endpoints file is no bill here
            prices = prices_for(state.model)
        return JSONResponse(await views.novel_detail(state.ctx.pool, _novel_id(request), prices))
    except store.StoreError as e:
        return _store_error(e)


async def api_chapter(request: Request) -> Response:
    try:
        prose = await views.chapter_prose(_state(request).ctx.pool, _novel_id(request),
                                          str(request.path_params["chapter_id"]))
    except store.StoreError as e:
        return _store_error(e)
    if prose is None:
        return JSONResponse({"error": "no such chapter"}, status_code=404)
    return JSONResponse(prose)


_FIELD = re.compile(r"^'?([A-Za-z0-9_.\[\]-]+|\(root\))'?: (.+)$", re.S)


def field_errors(message: str) -> list[dict[str, str | None]]:
    """`a.b: msg; c: msg` (the CLI's OutlineError text) as [{field, message}] for inline display."""
    out: list[dict[str, str | None]] = []
    for part in message.split("; "):
        m = _FIELD.match(part)
        if not m:
            out.append({"field": None, "message": part})
            continue
        field: str | None = m.group(1)
        text = m.group(2).removeprefix("Value error, ")
        if field == "(root)":  # a whole-model check (an outline revision's layers together)
            field = None
        inner = _FIELD.match(text)  # a model check naming its own path: outline + scenes[0].goal
        if inner:
            field, text = (f"{field}." if field else "") + inner.group(1), inner.group(2)
        out.append({"field": field, "message": text})
    return out


def _invalid(errors: list[dict[str, str | None]]) -> JSONResponse:
    return JSONResponse({"errors": errors, "created": False}, status_code=422)


async def _subagent_refusal(state: PanelState) -> str | None:
    """What `novel create` checks for a subagent novel: the writer model passes P1–P3 (SPEC §13)."""
    report = cached_report(state.home, state.model)
    if report is None or not report.subagent_ok:
        try:
            provider = make_provider(state.model, local_server=open_local_server)
        except ProviderError as e:
            return str(e)
        try:
            report = await run_probes(provider, model=state.model)
        finally:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()
        save_report(state.home, report)
    if report.subagent_ok:
        return None
    return (f"writer model {state.model!r} did not pass the probes a subagent novel requires "
            f"({', '.join(REQUIRED_FOR_SUBAGENT)}); run `novelbus probe --model {state.model}` for the "
            "report, or choose writer mode inline. Nothing was created.")


async def _pasted_or_uploaded(request: Request, text_field: str, *, unreadable_field: str,
                              missing_field: str | None, what: str) -> tuple[FormData, bytes | str] | JSONResponse:
    """A form's uploaded `file` (preferred) or its pasted `text_field`, with the form itself; or
    the 422 answer naming the field when the form cannot be read or gives neither."""
    try:
        form = await request.form(max_files=1, max_fields=8, max_part_size=MAX_NOVEL_FILE)
    except Exception as e:  # noqa: BLE001 - a malformed multipart body
        return _invalid([{"field": unreadable_field, "message": f"the form could not be read: {e}"}])
    upload, text = form.get("file"), form.get(text_field)
    if isinstance(upload, UploadFile) and upload.filename:
        return form, await upload.read()
    if isinstance(text, str) and text.strip():
        return form, text
    return _invalid([{"field": missing_field, "message": f"nothing given: paste the {what} or choose a file"}])


async def api_create(request: Request) -> Response:
    """Create a novel from a pasted or uploaded novel file; on any error nothing is created."""
    state = _state(request)
    got = await _pasted_or_uploaded(request, "text", unreadable_field="file", missing_field=None, what="novel JSON")
    if isinstance(got, JSONResponse):
        return got
    form, raw = got
    try:  # the CLI's reading and checks (`novelbus novel create`), so the messages are the same
        nf = parse_novel_file(raw.encode() if isinstance(raw, str) else raw)
    except OutlineError as e:
        return _invalid(field_errors(str(e)))
    overrides = {k: str(v) for k in ("writerMode", "writerShape") if (v := form.get(k))}
    if overrides:
        try:
            config = NovelConfig.model_validate({**nf.config.model_dump(mode="json"), **overrides})
        except ValidationError as e:
            return _invalid([{"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]}
                             for err in e.errors()])
        nf = NovelFile.model_validate({**nf.model_dump(mode="json"), "config": config.model_dump(mode="json")})
    if nf.config.writerMode == "subagent" and (why := await _subagent_refusal(state)):
        return _invalid([{"field": "writerMode", "message": why}])
    try:
        novel_id = await actions.create(state.ctx, nf)
    except store.StoreError as e:
        return _invalid([{"field": "novelId" if isinstance(e, store.NovelExists) else None,
                          "message": f"{e.code}: {e}"}])
    return JSONResponse({"novelId": novel_id, "created": True}, status_code=201)


async def api_steer(request: Request) -> Response:
    action = str(request.path_params["action"])
    if action not in actions.STEER_ACTIONS:
        return JSONResponse({"error": f"unknown action {action!r}"}, status_code=404)
    try:
        novel = await actions.steer(_state(request).ctx, _novel_id(request), action)
    except store.StoreError as e:
        return _store_error(e)
    return JSONResponse({"novelId": novel.novel_id, "status": novel.status, "pauseReason": novel.pause_reason})


async def api_mode(request: Request) -> Response:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return JSONResponse({"error": "body must be JSON: {\"mode\": \"inline\" | \"subagent\"}"}, status_code=400)
    mode = body.get("mode") if isinstance(body, dict) else None
    if mode not in ("inline", "subagent"):
        return JSONResponse({"error": "unknown writer mode; use inline or subagent"}, status_code=400)
    try:
        novel_id = _novel_id(request)
        await actions.switch_mode(_state(request).ctx, novel_id, mode)
    except store.StoreError as e:
        return _store_error(e)
    return JSONResponse({"novelId": novel_id, "writerMode": mode})


# --- steering (PLAN-1..5): requests on novelbus.cmd.steer, served by the driver ---------------
# The same functions as `novelbus novel outline|revise|revisions|config|direct|requirements`
# (novelbus.app.actions): the panel reads the input the CLI's way and sends the same request.
MAX_STEER_JSON = 256 * 1024  # bytes of a directive / config request body
NO_DRIVER = ("no driver answers on novelbus.cmd.steer: steering needs a running deployment "
             "(`novelbus up`, or `novelbus actor driver`)")


def _unavailable() -> JSONResponse:
    return JSONResponse({"error": NO_DRIVER, "errors": [{"field": None, "message": NO_DRIVER}]}, status_code=503)


def _refused(e: RemoteError, field: str | None = None, **extra: Any) -> JSONResponse:
    """A refusal from the driver: 404 for an unknown novel, 422 for bad input (errors naming the
    field), 409 for a state conflict. Its message names ids and fields, never content."""
    if e.code == "novel-not-found":
        return JSONResponse({"error": f"{e.code}: {e.detail}"}, status_code=404)
    if e.code in ("bad-outline", "config-invalid", "bad-directive", "bad-request"):
        errors = field_errors(e.detail)
        if field is not None:
            errors = [{"field": x["field"] or field, "message": x["message"]} for x in errors]
        status = 422
    else:
        errors = [{"field": field, "message": f"{e.code}: {e.detail}"}]
        status = 409
    return JSONResponse({"code": e.code, "errors": errors, **extra}, status_code=status)


def _wire(reply: Any) -> Any:
    out = msgspec.to_builtins(reply)
    if isinstance(out, dict):
        out.pop("type", None)
    return out


async def _json_body(request: Request) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    if len(raw) > MAX_STEER_JSON:
        return JSONResponse({"errors": [{"field": None, "message": f"request body over {MAX_STEER_JSON} bytes"}]},
                            status_code=413)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JSONResponse({"errors": [{"field": None, "message": "the body must be a JSON object"}]},
                            status_code=400)
    return body


async def _novel_and_body(request: Request) -> tuple[str, dict[str, Any]] | JSONResponse:
    """The path's novel id and the request's JSON-object body, or the answer refusing them
    (404 unknown novel id, 413 too large, 400 not a JSON object)."""
    try:
        novel_id = _novel_id(request)
    except store.NovelNotFound as e:
        return _store_error(e)
    body = await _json_body(request)
    if isinstance(body, JSONResponse):
        return body
    return novel_id, body


async def api_steering(request: Request) -> Response:
    """What the steering section shows: the outline state (with the outline), the revisions, the
    requirements ledger and the config — four reads on the bus, as `novelbus novel …` makes them."""
    ctx = _state(request).ctx
    try:
        novel_id = _novel_id(request)
        client = actions.steering(ctx)
        outline, revisions, ledger, config = await asyncio.gather(
            client.outline(novel_id), client.revisions(novel_id), client.requirements(novel_id),
            actions.configure(ctx, novel_id, {}))
    except store.NovelNotFound as e:
        return _store_error(e)
    except RemoteError as e:
        return _refused(e)
    except BusUnavailable:
        return _unavailable()
    return JSONResponse({"outline": _wire(outline), "revisions": _wire(revisions),
                         "requirements": _wire(ledger), "config": _wire(config)["config"]})


async def api_revise(request: Request) -> Response:
    """Revise the outline from a pasted or uploaded layers file, compare-and-set on `expect`
    (PLAN-1). Any refusal changes nothing; a stale `expect` answers 409 naming the current revision."""
    ctx = _state(request).ctx
    try:
        novel_id = _novel_id(request)
    except store.NovelNotFound as e:
        return _store_error(e)
    got = await _pasted_or_uploaded(request, "layers", unreadable_field="layers", missing_field="layers",
                                    what="layers JSON")
    if isinstance(got, JSONResponse):
        return got
    form, raw = got
    try:
        layers = actions.parse_layers(raw)
    except OutlineError as e:
        return _invalid([{"field": "layers", "message": str(e)}])
    expect = str(form.get("expect") or "").strip() or None
    reason = str(form.get("reason") or "").strip() or "revised in the panel"
    apply = [r for r in re.split(r"[\s,]+", str(form.get("apply") or "")) if r]
    try:
        revised = await actions.revise(ctx, novel_id, layers, expected_revision=expect, reason=reason, apply=apply)
    except RemoteError as e:
        if e.code != "revision-conflict":
            return _refused(e, "layers" if e.code == "bad-outline" else None)
        try:
            current = (await actions.steering(ctx).outline(novel_id)).revision
        except (RemoteError, BusUnavailable):
            current = None
        return _refused(e, "expect", currentRevision=current)
    except BusUnavailable:
        return _unavailable()
    return JSONResponse(_wire(revised))


async def api_direct(request: Request) -> Response:
    """A user directive into the requirements ledger (PLAN-4). The text travels in the body only;
    the reply and the events carry its id, never the text. Idempotent on `messageId`."""
    ctx = _state(request).ctx
    got = await _novel_and_body(request)
    if isinstance(got, JSONResponse):
        return got
    novel_id, body = got
    text = body.get("text")
    if not isinstance(text, str):
        return _invalid([{"field": "text", "message": "directive text must be a string"}])
    if not text.strip():
        return _invalid([{"field": "text", "message": "directive text must not be empty"}])
    message_id = body.get("messageId") or actions.new_message_id("panel")
    if not isinstance(message_id, str):
        return _invalid([{"field": "messageId", "message": "messageId must be a string"}])
    try:
        received = await actions.direct(ctx, novel_id, text, message_id)
    except RemoteError as e:
        return _refused(e, "messageId" if e.code == "message-id-conflict" or "messageId" in e.detail else "text")
    except BusUnavailable:
        return _unavailable()
    return JSONResponse({**_wire(received), "messageId": message_id})


async def api_config(request: Request) -> Response:
    """Set config fields by path (PLAN-5): `{"set": {"budgets.maxTurns": "400"}}`; string values
    are read like `novel config --set FIELD=VALUE` (JSON, else a bare word). Invalid → 422 naming
    the field, nothing changed; a budget pause the new budgets allow is lifted."""
    ctx = _state(request).ctx
    got = await _novel_and_body(request)
    if isinstance(got, JSONResponse):
        return got
    novel_id, body = got
    changes = body.get("set")
    if changes is not None and not isinstance(changes, dict):
        return _invalid([{"field": "set", "message": 'must be an object of field paths: {"set": {"budgets.maxTurns": 400}}'}])
    if not changes:
        return _invalid([{"field": None, "message": 'nothing to change: send {"set": {"budgets.maxTurns": 400}}'}])
    parsed = {str(k): actions.parse_config_value(v) if isinstance(v, str) else v for k, v in changes.items()}
    try:
        configured = await actions.configure(ctx, novel_id, parsed)
    except RemoteError as e:
        return _refused(e)
    except BusUnavailable:
        return _unavailable()
    return JSONResponse(_wire(configured))


# --- live events -----------------------------------------------------------------------------
MAX_STREAM_SEQ = 2**63 - 1  # JetStream sequences are uint64; a start past int64 is refused by the server


async def _event_source(request: Request, novel_id: str | None) -> Response:
    """Server-sent events from the JetStream event stream (BUS-3). Each SSE id is the stream
    sequence, so a reconnecting browser (Last-Event-ID) resumes right after the last one it saw.
    A novel's stream starts from its first event; the all-novels stream from now."""
    ctx = _state(request).ctx
    last = request.headers.get("last-event-id", "").strip()
    if last and not (last.isascii() and last.isdigit() and int(last) < MAX_STREAM_SEQ):
        return JSONResponse({"error": "Last-Event-ID must be an event id this panel sent (a stream sequence)"},
                            status_code=400)
    if last:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=int(last) + 1)
    else:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL if novel_id else DeliverPolicy.NEW)
    queue: asyncio.Queue[Any] = asyncio.Queue()
    sub = await ctx.js.subscribe(ctx.subjects.events_of(novel_id), stream=ctx.subjects.events_stream,
                                 ordered_consumer=True, config=config, cb=queue.put)
    closing = _state(request).closing

    async def stream() -> AsyncIterator[dict[str, str]]:
        stop = asyncio.ensure_future(closing.wait())
        get: asyncio.Future[Any] | None = None
        try:
            yield {"event": "ready", "data": "{}"}
            while True:
                get = asyncio.ensure_future(queue.get())
                await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():  # the panel is shutting down: end the stream cleanly
                    return
                msg = get.result()
                yield {"id": str(msg.metadata.sequence.stream), "event": "novel", "data": msg.data.decode()}
        finally:
            stop.cancel()
            if get is not None:
                get.cancel()
            await sub.unsubscribe()

    return EventSourceResponse(stream(), ping=10, headers={"x-accel-buffering": "no"})


async def sse_all(request: Request) -> Response:
    return await _event_source(request, None)


async def sse_novel(request: Request) -> Response:
    try:
        novel_id = _novel_id(request)
    except store.NovelNotFound as e:
        return _store_error(e)
    return await _event_source(request, novel_id)


async def not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse("not found", status_code=404)


def create_app(state: PanelState) -> ASGIApp:
    routes = [
        Route("/", page_novels),
        Route("/new", page_create),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/novels/{novel_id}", page_novel),
        Route("/novels/{novel_id}/export.md", export_md),
        Route("/novels/{novel_id}/context", page_context_verify),  # CTX-12
        Route("/api/novels/{novel_id}/context-verify", api_context_verify),
        Route("/api/novels", api_novels, methods=["GET"]),
        Route("/api/novels", api_create, methods=["POST"]),
        Route("/api/events", sse_all),
        Route("/api/novels/{novel_id}", api_novel),
        Route("/api/novels/{novel_id}/events", sse_novel),
        Route("/api/novels/{novel_id}/chapters/{chapter_id}", api_chapter),
        Route("/api/novels/{novel_id}/mode", api_mode, methods=["POST"]),
        Route("/api/novels/{novel_id}/steering", api_steering, methods=["GET"]),
        Route("/api/novels/{novel_id}/revise", api_revise, methods=["POST"]),
        Route("/api/novels/{novel_id}/direct", api_direct, methods=["POST"]),
        Route("/api/novels/{novel_id}/config", api_config, methods=["POST"]),
        Route("/api/novels/{novel_id}/{action}", api_steer, methods=["POST"]),
        *review.routes(),  # STUDY-3 review pages, STUDY-4 report
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found})
    app.state.panel = state
    return Guard(app, state)
