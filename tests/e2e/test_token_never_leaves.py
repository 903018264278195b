"""REL-4 / ARCH-2: the execution token never appears on the wire, in streams or in event rows."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from novelbus import store
from novelbus.actors.claims import Delegation
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel


class RecordingDelegations(dict[str, Delegation]):
    """Test instrumentation: remembers every delegation the claim manager registers."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Delegation] = []

    def __setitem__(self, key: str, value: Delegation) -> None:
        self.seen.append(value)
        super().__setitem__(key, value)


async def _read_stream(js: Any, stream: str, subject: str) -> list[Any]:
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    info = await js.stream_info(stream)
    out = []
    for _ in range(info.state.messages):
        out.append(await sub.next_msg(timeout=5))
    await sub.unsubscribe()
    return out


async def test_execution_token_never_on_the_wire(stack: Runtime) -> None:
    """REL-4"""
    ctx = stack.ctx
    claims = stack.actor("claims")
    recorder = RecordingDelegations()
    claims.state.delegations = recorder  # type: ignore[attr-defined]

    wire: list[bytes] = []

    async def tap(msg: Any) -> None:
        wire.append(msg.subject.encode() + b"\n" + msg.data + b"\n" + json.dumps(msg.headers or {}).encode())

    spy = await ctx.nc.subscribe(">", cb=tap)  # every subject, replies included
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    await ctx.nc.flush()
    await spy.unsubscribe()

    tokens = [d.execution_token for d in recorder.seen]
    assert len(tokens) >= 9 and all(len(t) == 64 for t in tokens)  # 256-bit, hex
    needles = [t.encode() for t in tokens] + [bytes.fromhex(t) for t in tokens]

    for m in await _read_stream(ctx.js, ctx.subjects.events_stream, ctx.subjects.events_all):
        wire.append(m.data + json.dumps(m.headers or {}).encode())
    for m in await _read_stream(ctx.js, ctx.subjects.work_stream, ctx.subjects.work_all):
        wire.append(m.data + json.dumps(m.headers or {}).encode())
    rows = await store.list_events(ctx.pool, novel_id)
    wire.extend(json.dumps(r.payload).encode() for r in rows)
    runs = await store.list_writer_runs(ctx.pool, novel_id)
    wire.extend(json.dumps(msgspec.to_builtins(r), default=str).encode() for r in runs)

    assert len(wire) > 100
    blob = b"\n".join(wire)
    for needle in needles:
        assert needle not in blob
    # and only the SHA-256 is stored for claims: no token in any table dump
    dump = await ctx.pool.fetch("SELECT to_jsonb(u)::text AS j FROM units u")
    assert not any(t in r["j"] for r in dump for t in tokens)
