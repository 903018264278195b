"""A scripted chat-completions server for provider tests, bound to 127.0.0.1 only.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) for the `openai` client.
Each request takes the next scripted response; every request body is recorded.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Response = tuple[int, dict[str, str], bytes]
Step = Response | Callable[[dict[str, Any]], Response]
# Answers every request past the script (e.g. a fake model), possibly asynchronously.
Responder = Callable[[dict[str, Any]], Response | Awaitable[Response]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return (
        status,
        {"content-type": "application/json", **(headers or {})},
        json.dumps(body).encode(),
    )


def completion(
    *,
    content: str | None = None,
    tool_calls: list[tuple[str, str, str]] | None = None,
    finish_reason: str = "stop",
    usage: dict[str, Any] | None = None,
) -> Response:
    """A chat.completion body; tool_calls are (id, name, arguments JSON text)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return json_response(body)


@dataclass
class ChatServer:
    script: list[Step]
    responder: Responder | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    port: int = 0  # 0: any free port; a fixed one brings a stopped server back at the same URL
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/v1"

    async def __aenter__(self) -> ChatServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):  # end keep-alive connections so handlers return
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                _, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = json.loads(body) if body else {}
                self.requests.append(request)
                self.paths.append(path)
                self.headers.append(headers)
                index = len(self.requests) - 1
                if index < len(self.script):
                    step = self.script[index]
                    status, resp_headers, payload = step(request) if callable(step) else step
                elif self.responder is not None:
                    answer = self.responder(request)
                    if inspect.isawaitable(answer):
                        answer = await answer
                    status, resp_headers, payload = answer
                else:
                    status, resp_headers, payload = json_response(
                        {"error": "script exhausted"}, 500
                    )
                head = [f"HTTP/1.1 {status} X", f"content-length: {len(payload)}"]
                head += [f"{k}: {v}" for k, v in resp_headers.items()]
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
