"""The writer runner's session store in PostgreSQL (RUN-5): `writers.sessions.SessionStore` over
`store.save_session` / `store.load_session`. Wiring between two rooms, so it lives with the actor
that uses it (writers/ never imports the store)."""

from __future__ import annotations

from typing import Any

from novelbus import store
from novelbus.writers.provider import ChatMessage
from novelbus.writers.sessions import StoredSession


class PgSessionStore:
    """Sessions of ONE novel in PostgreSQL (`store.save_session` / `store.load_session`).

    A session id that belongs to another novel is never continued: `load` answers None.
    """

    def __init__(self, pool: Any, novel_id: str) -> None:
        self.pool = pool
        self.novel_id = novel_id

    @property
    def location(self) -> str:
        return f"postgres:sessions[novel={self.novel_id}]"

    async def load(self, session_id: str) -> StoredSession | None:
        row = await store.load_session(self.pool, session_id)
        if row is None or row.novel_id != self.novel_id:
            return None
        history = [m for m in row.history if isinstance(m, dict)]
        return StoredSession(row.session_id, row.chapter_id, history)

    async def save(self, session_id: str, chapter_id: str | None, history: list[ChatMessage]) -> None:
        await store.save_session(self.pool, session_id, self.novel_id, chapter_id, history)
