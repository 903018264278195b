"""RUN-5 session reuse: a revision of the same chapter continues the stored session,
a rewrite (or another chapter) starts fresh; the conversation is saved back under the same id."""

from __future__ import annotations

import json
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.writer_sessions import PgSessionStore
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.chat import message_chars
from novelbus.writers.offline import ScriptedProvider
from novelbus.writers.runner import ExecutionPolicy, RunOutcome, run_w2
from novelbus.writers.sessions import MemorySessionStore, closed_history
from novelbus.writers.tools import COMMIT_TOOL, W2_ALLOW_LIST
from tests.writers.test_runner import COMMIT_ARGS, PACK, Host, call, text, tools

REVISED_PACK = PACK.replace("targetMax: 500", "targetMax: 600")


async def w2(provider: ScriptedProvider, pack: str, policy: ExecutionPolicy | None, **kw: Any) -> RunOutcome:
    return await run_w2(provider, pack, allow_list=W2_ALLOW_LIST, read_tool=Host().read_tool,
                        commit=Host().commit, max_output_tokens=1000, policy=policy, **kw)


async def test_revision_of_the_same_chapter_continues_the_session_and_a_rewrite_starts_fresh() -> None:
    """RUN-5"""
    sessions = MemorySessionStore()
    policy = ExecutionPolicy(session_id="sess-ch1", session_store=sessions)

    first = ScriptedProvider([tools(call("novel_status_read", {}, "a")), tools(call(COMMIT_TOOL, COMMIT_ARGS, "b"))])
    outcome = await w2(first, PACK, policy, chapter_id="ch1")
    assert outcome.ok and not outcome.session_continued
    saved = sessions.sessions["sess-ch1"]
    assert saved.chapter_id == "ch1"
    assert [m["role"] for m in saved.history] == ["system", "user", "assistant", "tool", "assistant", "tool"]

    # A revision of the same chapter: the stored conversation is re-sent first, the new pack follows.
    second = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
    revised = await w2(second, REVISED_PACK, policy, chapter_id="ch1")
    assert revised.ok and revised.session_continued
    sent, _ = second.calls[0]
    assert sent[: len(saved.history)] == saved.history
    assert sent[-1]["role"] == "user" and REVISED_PACK in sent[-1]["content"]
    assert [m["role"] for m in sent].count("system") == 1  # the new pack is a user turn
    usage = revised.usage[0]
    assert usage.history_chars + usage.prose_echo_chars == sum(message_chars(m) for m in saved.history)
    assert usage.pack_chars == message_chars(sent[-1]) and usage.input_chars == usage.input_split.total
    assert len(sessions.sessions["sess-ch1"].history) == len(saved.history) + 3  # saved back, longer

    # A rewrite starts a new session under the same id, even for the same chapter.
    third = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "d"))])
    rewritten = await w2(third, PACK, policy, chapter_id="ch1", rewrite=True)
    assert rewritten.ok and not rewritten.session_continued
    assert [m["role"] for m in third.calls[0][0]] == ["system", "user"]
    assert len(sessions.sessions["sess-ch1"].history) == 4

    # Another chapter is not a revision: fresh too.
    fourth = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "e"))])
    other = await w2(fourth, PACK, policy, chapter_id="ch2")
    assert not other.session_continued and [m["role"] for m in fourth.calls[0][0]] == ["system", "user"]
    assert sessions.sessions["sess-ch1"].chapter_id == "ch2"


async def test_without_a_session_nothing_is_stored_and_every_run_is_fresh() -> None:
    """RUN-5"""
    provider = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "a")), tools(call(COMMIT_TOOL, COMMIT_ARGS, "b"))])
    for _ in range(2):
        outcome = await w2(provider, PACK, None, chapter_id="ch1")
        assert outcome.ok and not outcome.session_continued
    assert [len(m) for m, _ in provider.calls] == [2, 2]


async def test_a_failed_run_is_saved_too_and_its_unexecuted_calls_are_closed() -> None:
    """RUN-5: A dispatch that stops without committing leaves a session a revision can pick up; calls
    after a successful commit get a 'not-executed' answer so a chat server accepts the history."""
    sessions = MemorySessionStore()
    policy = ExecutionPolicy(session_id="s", session_store=sessions)
    failed = await w2(ScriptedProvider([text("I need more time."), text("Still not.")]), PACK, policy,
                      chapter_id="ch1")
    assert failed.reason == "not-committed"
    assert sessions.sessions["s"].history[-2:] == [{"role": "assistant", "content": "I need more time."},
                                                   {"role": "assistant", "content": "Still not."}]

    both = tools(call(COMMIT_TOOL, COMMIT_ARGS, "one"), call("novel_status_read", {}, "two"))
    ok = await w2(ScriptedProvider([both]), PACK, policy, chapter_id="ch1")
    assert ok.ok and ok.session_continued
    history = sessions.sessions["s"].history
    answered = [m["tool_call_id"] for m in history if m["role"] == "tool"]
    assert answered == ["one", "two"]
    assert json.loads(history[-1]["content"])["error"] == "not-executed"
    assert closed_history(history) == history  # already closed: unchanged


async def test_sessions_in_postgres_are_per_novel(new_database: Any) -> None:
    """RUN-5: The PostgreSQL store continues a session of its own novel only."""
    pool = await store.connect(await new_database())
    try:
        await store.migrate(pool)
        nf = parse_novel_file(sample_novel_bytes())
        a = await store.create_novel(pool, nf.model_copy(update={"novelId": "n-a"}))
        b = await store.create_novel(pool, nf.model_copy(update={"novelId": "n-b"}))
        mine = ExecutionPolicy(session_id="sess-1", session_store=PgSessionStore(pool, a))
        first = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "a"))])
        await w2(first, PACK, mine, chapter_id="ch1")
        row = await store.load_session(pool, "sess-1")
        assert row is not None and row.novel_id == a and row.chapter_id == "ch1" and len(row.history) == 4

        again = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "b"))])
        assert (await w2(again, REVISED_PACK, mine, chapter_id="ch1")).session_continued
        assert again.calls[0][0][:4] == row.history

        theirs = ExecutionPolicy(session_id="sess-1", session_store=PgSessionStore(pool, b))
        assert await theirs.session_store.load("sess-1") is None  # type: ignore[union-attr]
    finally:
        await pool.close()


def test_policy_needs_both_or_neither() -> None:
    """RUN-5"""
    with pytest.raises(ValueError, match="together"):
        ExecutionPolicy(session_id="s")
    with pytest.raises(ValueError, match="together"):
        ExecutionPolicy(session_store=MemorySessionStore())
