"""QUAL-2/3 through the W2 path and the CLI, as a user meets them: a W2 commit the content gate refuses
never becomes canon (the claim manager asks the verifier first), the writer hears the code and the
advice, the novel pauses as `quality` naming the check; `status --json` counts the refusals,
`novel list` shows the pause's detail, and `novel config --set quality.…` is validated and applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from tests.e2e.test_cli import _flags, novelbus
from tests.e2e.test_steering import watch


async def test_a_refused_w2_commit_never_becomes_canon_and_the_cli_names_the_check(
        stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """QUAL-2 / QUAL-3: the offline writer puts the scene's goal into its prose; with
    maxOutlineCopyShare set very low the gate refuses every W2 commit as copies-outline."""
    data: dict[str, Any] = generate_novel_file(1, 2, unit_chars=400)
    data["config"]["writerShape"] = "W2"
    data["config"]["quality"] = {"maxOutlineCopyShare": 0.01}
    path = tmp_path / "novel.json"
    path.write_text(json.dumps(data))
    flags = _flags(stack, nats_url)
    code, out, err = await novelbus("novel", "create", str(path), "--no-start", *flags)
    assert code == 0, err
    novel_id = out.strip().splitlines()[-1]
    events = await watch(stack, novel_id)
    await publish_notice(stack.ctx, novel_id, reason="test")
    paused = await events.wait_for(lambda e: isinstance(e, ev.NovelPaused), timeout=120)
    assert paused.reason == "quality" and paused.detail.startswith("copies-outline:")
    pool = stack.ctx.pool
    assert (await store.load_snapshot(pool, novel_id)).commits == []
    refused = events.of(ev.UnitRefused)
    assert refused and {(e.code, e.shape) for e in refused} == {("copies-outline", "W2")}

    code, out, err = await novelbus("status", novel_id, "--json", *flags)
    assert code == 0, err
    status = json.loads(out)
    assert status["pauseReason"] == "quality" and status["pauseDetail"].startswith("copies-outline:")
    # counted per attempt: the offline W2 writer committing the very same body again in its run
    # is the same attempt (a retried commit), counted once (tests/e2e/test_claim_and_verify.py)
    assert set(status["refusals"]) == {"copies-outline"} and 1 <= status["refusals"]["copies-outline"] <= len(refused)
    code, out, err = await novelbus("novel", "list", *flags)
    assert code == 0 and "quality: copies-outline" in out, out

    code, _, err = await novelbus("novel", "config", novel_id, "--set", "quality.minLetterShare=2", *flags)
    assert code == 2 and "quality.minLetterShare" in err
    code, _, err = await novelbus("novel", "config", novel_id, "--set", "quality.noSuchCheck=1", *flags)
    assert code == 2 and "noSuchCheck" in err
    code, out, err = await novelbus("novel", "config", novel_id, "--set", "quality.maxOutlineCopyShare=0.5",
                                    "--json", *flags)
    assert code == 0, err
    assert json.loads(out)["changed"] == ["quality.maxOutlineCopyShare"]
    code, _, err = await novelbus("novel", "resume", novel_id, *flags)
    assert code == 0, err
    await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=120)
    assert len((await store.load_snapshot(pool, novel_id)).commits) == 2
