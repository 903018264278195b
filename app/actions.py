"""What the novel-steering commands do, shared by the CLI and the web panel (OPS-1, OPS-2).

Each function takes a connected `ActorContext` and publishes exactly what its CLI command
publishes, so a novel paused, resumed, stopped, switched or created from the panel is
indistinguishable from one handled with `novelbus novel …`. Store errors propagate as typed
`StoreError`s; the callers turn them into an exit code or an HTTP status.

Steering beyond that (outline revisions, directives, config; PLAN-1..5) is a request on
`novelbus.cmd.steer`, served by the driver: both callers read their input with the same functions
here (`parse_layers`, `parse_config_value`, `requirement_updates`, `new_message_id`) and send it
with `revise` / `direct` / `configure` through the one `SteeringClient`; a refusal raises
`RemoteError` with the driver's stable code, nobody serving raises `BusUnavailable`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any, Literal

from novelbus import store
from novelbus.bus import outbox
from novelbus.bus.notices import publish_notice
from novelbus.bus.steering import SteeringClient
from novelbus.messages import events as ev
from novelbus.messages import steer as m
from novelbus.novel.outline import NovelFile, OutlineError
from novelbus.novel.requirements import RequirementUpdate

SteerAction = Literal["pause", "resume", "stop"]
STEER_ACTIONS: tuple[SteerAction, ...] = ("pause", "resume", "stop")
STEER_HELP = {"pause": "Pause a novel (user-request).", "resume": "Resume a paused novel.",
              "stop": "Stop a novel: pause it and return claimed units to prepared."}


async def create(ctx: Any, nf: NovelFile, *, start: bool = True) -> str:
    """Store a validated novel file; with `start`, publish its first work notice."""
    novel_id = await store.create_novel(ctx.pool, nf)
    if start:
        await publish_notice(ctx, novel_id, reason="created")
    return novel_id


async def steer(ctx: Any, novel_id: str, action: SteerAction) -> store.NovelRow:
    """Pause, resume or stop a novel; return it as it is afterwards."""
    if action == "pause":
        if await store.pause_novel(ctx.pool, novel_id, "user-request"):
            await ctx.emit(ev.NovelPaused(novel_id=novel_id, reason="user-request"))
    elif action == "stop":
        changed = await store.pause_novel(ctx.pool, novel_id, "stopped")
        await store.recover_claims(ctx.pool, novel_ids=[novel_id])
        if changed:
            await ctx.emit(ev.NovelPaused(novel_id=novel_id, reason="stopped"))
    elif action == "resume":
        if await store.resume_novel(ctx.pool, novel_id):
            await ctx.emit(ev.NovelResumed(novel_id=novel_id))
        await publish_notice(ctx, novel_id, reason="resume")
    else:
        raise ValueError(f"unknown action {action!r}; choose from {', '.join(STEER_ACTIONS)}")
    await outbox.settle()  # the event is in the ledger and its stream before the caller is answered
    return await store.get_novel(ctx.pool, novel_id)


async def switch_mode(ctx: Any, novel_id: str, mode: str) -> None:
    """Switch writerMode; it takes effect from the next unit (DRV-3)."""
    await store.set_writer_mode(ctx.pool, novel_id, mode)
    await ctx.emit(ev.ModeSwitched(novel_id=novel_id, writer_mode=mode))
    await outbox.settle()  # stored before the caller is answered (emit queues the ledger row)


# --- steering over the bus (PLAN-1..5), shared by `novelbus novel revise|direct|config` and the panel
LAYERS_HELP = ("an object of outline layers (story, chapters, scenes, characters, lore, foreshadowing, references), "
               "bare or as {\"outline\": …}")


def steering(ctx: Any) -> SteeringClient:
    """The steering client on a connected context's NATS connection and subjects."""
    return SteeringClient(ctx.nc, ctx.subjects)


def parse_layers(raw: bytes | str) -> dict[str, Any]:
    """The layers a revision replaces, as a user gives them (a file or pasted JSON): bare or wrapped
    like a novel file's `outline`. Raises OutlineError saying what is wrong; the layers themselves
    are checked by the driver (`bad-outline`, naming the field)."""
    if not raw.strip():
        raise OutlineError(f"the layers are empty: expected {LAYERS_HELP}")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OutlineError(f"not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise OutlineError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if isinstance(data, dict) and set(data) == {"outline"}:
        data = data["outline"]  # wrapped like a novel file
    if not isinstance(data, dict) or not data:
        raise OutlineError(f"expected {LAYERS_HELP}")
    return data


def parse_config_value(raw: str) -> Any:
    """A config value as typed: JSON (`400`, `null`, `{"maxAttempts": 2}`), else a bare word string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def requirement_updates(ids: Sequence[str]) -> list[RequirementUpdate]:
    """`--apply req-1 …`: the requirements a revision applies."""
    return [RequirementUpdate(requirement_id=r, status="applied") for r in ids]


def new_message_id(prefix: str) -> str:
    """A fresh directive message id (the ledger is idempotent on it)."""
    return f"{prefix}-{secrets.token_hex(8)}"


async def revise(ctx: Any, novel_id: str, layers: dict[str, Any], *, expected_revision: str | None,
                 reason: str, apply: Sequence[str] = (), hold_ms: int = 10_000) -> m.OutlineRevised:
    """Compare-and-set an outline revision (PLAN-1); omitted layers are carried forward."""
    return await steering(ctx).revise(novel_id, layers, expected_revision=expected_revision, reason=reason,
                                      requirements=requirement_updates(apply), hold_ms=hold_ms)


async def direct(ctx: Any, novel_id: str, text: str, message_id: str) -> m.DirectiveReceived:
    """Append a user directive to the requirements ledger (PLAN-4); idempotent on `message_id`."""
    return await steering(ctx).direct(novel_id, text, message_id)


async def configure(ctx: Any, novel_id: str, changes: dict[str, Any]) -> m.NovelConfigured:
    """Set config fields by dotted path (PLAN-5), validated like create; empty reads the config."""
    return await steering(ctx).config(novel_id, changes)
