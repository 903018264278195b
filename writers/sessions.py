"""Writer session reuse (RUN-5): continue a stored conversation or start fresh.

A session is a stored chat history under an id, in a store. The execution policy names both
together or neither (`writers.runner.ExecutionPolicy`). Continuing is a decision about the
*work*, made here once for every caller:

- a revision of the same chapter continues the stored session (its history is re-sent first);
- a rewrite, a session of another chapter, or a session that does not exist starts fresh.

Either way the run's conversation is saved back under the same id when it ends, so the next
revision can continue it. Stores hold histories only; they never see tokens, claim ids or
delegations (ARCH-2). `actors.writer_sessions.PgSessionStore` keeps sessions in PostgreSQL;
`MemorySessionStore` is for tools and tests.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from novelbus.writers.provider import ChatMessage


@dataclass(frozen=True)
class StoredSession:
    session_id: str
    chapter_id: str | None
    history: list[ChatMessage]


@runtime_checkable
class SessionStore(Protocol):
    @property
    def location(self) -> str:
        """Where sessions live, for diagnostics (never a secret)."""
        ...

    async def load(self, session_id: str) -> StoredSession | None: ...

    async def save(self, session_id: str, chapter_id: str | None, history: list[ChatMessage]) -> None: ...


@dataclass
class MemorySessionStore:
    sessions: dict[str, StoredSession] = field(default_factory=dict)

    @property
    def location(self) -> str:
        return "memory"

    async def load(self, session_id: str) -> StoredSession | None:
        found = self.sessions.get(session_id)
        return None if found is None else copy.deepcopy(found)

    async def save(self, session_id: str, chapter_id: str | None, history: list[ChatMessage]) -> None:
        self.sessions[session_id] = StoredSession(session_id, chapter_id, copy.deepcopy(history))


async def resume_history(
    store: SessionStore, session_id: str, chapter_id: str | None, *, rewrite: bool
) -> list[ChatMessage]:
    """The history a run continues: the stored one for a revision of the same chapter, else []."""
    if rewrite:
        return []
    stored = await store.load(session_id)
    if stored is None or stored.chapter_id != chapter_id:
        return []
    return stored.history


def closed_history(messages: list[ChatMessage]) -> list[ChatMessage]:
    """`messages` made safe to continue: every assistant tool call gets a tool result.

    A run that ends at its first successful commit leaves later calls of the same reply
    unanswered; chat servers refuse a history like that, so they are answered as not executed.
    """
    out: list[ChatMessage] = []
    pending: list[str] = []

    def flush() -> None:
        for call_id in pending:
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": '{"error":"not-executed","reason":"the run had ended"}',
                }
            )
        pending.clear()

    for message in messages:
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id in pending:
                pending.remove(call_id)
            out.append(message)
            continue
        flush()
        out.append(message)
        pending.extend(c.get("id", "") for c in message.get("tool_calls") or ())
    flush()
    return out
