"""OPS-12: `novelbus dlq list|show|replay|drop` against real NATS and PostgreSQL — a poisoned
notice lands in the dead-letter stream, `list` shows it with its reason, `replay` of a message whose
cause was fixed is handled once by the normal path, `drop` removes a letter."""

from __future__ import annotations

import json
from typing import Any

from novelbus import store
from novelbus.actors.runtime import running
from novelbus.bus.notices import publish_notice
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.test_cli import novelbus
from tests.waiting import novel_stopped, wait_until, work_drained

SECRET_WORDS = "the-payload-text-nobody-should-see"


async def test_a_poisoned_notice_is_listed_replayed_once_after_its_fix_and_a_bad_one_dropped(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """OPS-12, REL-2: a notice for a novel that does not exist yet dies `novel-not-found`; once the
    novel exists, `dlq replay` sends it down the normal path and the novel finishes with one
    commit per unit; a replay of the same letter again is refused (it is gone); a malformed
    message dies `bad-message` and `dlq drop` removes it. No command prints a payload's text."""
    dsn = await new_database()
    s = Subjects(namespace)
    flags = ["--nats-url", nats_url, "--database-url", dsn, "--namespace", namespace]
    async with running(nats_url, dsn, subjects=s, actor_kwargs={"driver": {"redelivery_backoff_s": 0.02}}) as rt:
        ctx = rt.ctx
        await publish_notice(ctx, "n-late", reason="early")
        await ctx.js.publish(s.work("n-garbled"), b'{"not json ' + SECRET_WORDS.encode())

        async def two_letters() -> bool:
            return (await ctx.js.stream_info(s.dlq_stream)).state.messages == 2
        await wait_until(two_letters, 60, "both poisoned messages in the dead-letter stream")

        code, out, err = await novelbus("dlq", "list", "--json", *flags)
        assert code == 0, err
        letters = {d["reason"]: d for d in json.loads(out)}
        assert set(letters) == {"novel-not-found", "bad-message"}, out
        late, garbled = letters["novel-not-found"], letters["bad-message"]
        assert late["subject"] == s.work("n-late") and late["type"] == "work.notice", late
        assert late["ids"]["novelId"] == "n-late" and late["deliveries"] >= 1 and late["size"] > 0
        assert garbled["subject"] == s.work("n-garbled") and garbled["ids"] == {}

        code, out, err = await novelbus("dlq", "list", *flags)
        assert code == 0 and "novel-not-found" in out and s.work("n-late") in out, (out, err)
        code, shown, err = await novelbus("dlq", "show", str(garbled["seq"]), *flags)
        assert code == 0 and "bad-message" in shown, err
        assert SECRET_WORDS not in out + shown  # metadata only, never the payload (REL-4)

        nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": "n-late"})
        await store.create_novel(ctx.pool, nf)  # the fix: the novel the notice names exists now
        code, out, err = await novelbus("dlq", "replay", str(late["seq"]), *flags)
        assert code == 0 and f"replayed {late['seq']}" in out, err
        finished = await novel_stopped(ctx.pool, "n-late", timeout=120)
        assert finished.status == "finished", finished
        await work_drained(rt)
        commits = await store.count_commits_per_unit(ctx.pool, "n-late")
        snap = await store.load_snapshot(ctx.pool, "n-late")
        assert snap.outline is not None and len(commits) == len(snap.outline.scenes)
        assert set(commits.values()) == {1}, commits

        code, out, err = await novelbus("dlq", "replay", str(late["seq"]), *flags)
        assert code == 2 and f"no dead letter {late['seq']}" in err, (code, out, err)

        code, out, err = await novelbus("dlq", "drop", str(garbled["seq"]), *flags)
        assert code == 0 and f"dropped {garbled['seq']}" in out, err
        code, out, err = await novelbus("dlq", "list", "--json", *flags)
        assert code == 0 and json.loads(out) == [], out
        assert (await ctx.js.stream_info(s.dlq_stream)).state.messages == 0
