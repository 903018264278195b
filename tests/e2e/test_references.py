"""Licensed references (CTX-13) end to end: a production style sample reaches the writer's pack
and no other role's input, never becomes canon, is left out (with its reason) once expired, and
is kept with `novelbus novel references`; every freeze still verifies (CTX-12)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.store.freezes import verify_freezes
from tests.e2e.conftest import run_novel
from tests.e2e.test_cli import _flags
from tests.e2e.test_pack_cli import novelbus

pytestmark = pytest.mark.timeout(300)

PHRASE = "quartz-lantern of Zanzibar"
SAMPLE = {"referenceId": "voice-1", "kind": "style", "text": f"Rain ran off the {PHRASE} in thin grey ropes.",
          "source": "the author's own notebook", "licence": "CC BY 4.0", "purposes": ["production"], "expires": None}


def novel(*refs: dict[str, Any]) -> NovelFile:
    data = json.loads(sample_novel_bytes())
    data["references"] = list(refs)
    data["config"].update({"extractor": "offline", "canonSource": "both", "detector": "offline"})
    return parse_novel_file(json.dumps(data))


async def test_a_style_sample_reaches_only_the_writers_pack_and_never_becomes_canon(
    stack: Runtime, nats_url: str, tmp_path: Path
) -> None:
    """CTX-13: the writer's projection (`pack --role writer`) carries the sample under
    `[[pattern-references]]`; the extractor's and the detector's do not; no commit body, writer
    fact or extracted fact holds its phrase; every freeze verifies. Marked expired (a revision
    through `novelbus novel references add --replace --expires`), it leaves the writer's pack and the
    manifest says why; `list` and `remove` round it off."""
    novel_id, _ = await run_novel(stack, novel(SAMPLE))
    driver: Any = stack.actor("driver")
    await driver.canon.sweep()
    pool = stack.ctx.pool
    flags = _flags(stack, nats_url)
    unit = (await store.list_commits(pool, novel_id))[-1].unit_id
    views = {}
    for role in ("writer", "extractor", "detector"):
        code, out, err = await novelbus("pack", novel_id, unit, "--role", role, "--json", *flags)
        assert code == 0, (role, err)
        views[role] = json.dumps(json.loads(out)["projection"], ensure_ascii=False)
    assert "[[pattern-references]]" in views["writer"] and PHRASE in views["writer"]
    assert PHRASE not in views["extractor"] and PHRASE not in views["detector"]

    # never canon: not in the prose, the writer's facts or the extractor's facts
    assert await pool.fetchval("SELECT count(*) FROM extracted_commits WHERE novel_id = $1", novel_id) > 0
    for sql in ("SELECT count(*) FROM commits WHERE novel_id = $1 AND body::text LIKE $2",
                "SELECT count(*) FROM canon_facts WHERE novel_id = $1 AND (summary || coalesce(detail, '')) LIKE $2",
                "SELECT count(*) FROM extracted_canon WHERE novel_id = $1 AND (summary || coalesce(detail, '')) LIKE $2"):
        assert await pool.fetchval(sql, novel_id, f"%{PHRASE}%") == 0, sql
    freezes = await pool.fetch("SELECT manifest FROM context_freeze WHERE novel_id = $1", novel_id)
    by_scenario: dict[str, set[str]] = {}
    for f in freezes:
        m = f["manifest"]
        kept = {s["sourceId"] for s in m["sources"] if s["layer"] == "L3"}
        left = {o["reason"] for o in m["omitted"] if o["layer"] == "L3"}
        by_scenario.setdefault(m["request"]["scenario"], set()).update(kept or left)
    assert by_scenario["generation"] == {"voice-1"}
    assert by_scenario["extraction"] == {"not-requested:extraction"}
    assert by_scenario["detection"] == {"not-requested:detection"}
    assert (await verify_freezes(pool, novel_id)).mismatches == []

    # a novel still open to revisions (paused, its first unit prepared): mark the sample expired
    open_id = await store.create_novel(pool, novel(SAMPLE))
    await store.pause_novel(pool, open_id, "user-request")
    first = await store.prepare_unit(pool, open_id, "ch1", "cold-lamp", fragment=1, continuation_anchor=None)
    code, out, err = await novelbus("pack", open_id, first, "--json", *flags)
    assert code == 0, err
    assert PHRASE in json.loads(out)["text"]
    text = tmp_path / "sample.txt"
    text.write_text(SAMPLE["text"])
    code, out, err = await novelbus("novel", "references", open_id, "add", "--id", "voice-1", "--text", str(text),
                                    "--source", "the author's own notebook", "--licence", "CC BY 4.0",
                                    "--expires", "2020-01-01", "--replace", *flags)
    assert code == 0, err
    code, out, err = await novelbus("pack", open_id, first, "--json", *flags)
    assert code == 0, err
    info = json.loads(out)
    assert PHRASE not in info["text"] and "pattern-references" not in info["blocks"]
    assert info["manifest"]["omitted"] == {**info["manifest"]["omitted"], "L3 reference-style: expired:2020-01-01": 1}

    code, out, err = await novelbus("novel", "references", open_id, "list", "--json", *flags)
    assert code == 0, err
    (listed,) = json.loads(out)["references"]
    assert (listed["referenceId"], listed["expires"], listed["purposes"]) == ("voice-1", "2020-01-01", ["production"])
    code, _, err = await novelbus("novel", "references", open_id, "add", "--id", "voice-1", "--text", str(text),
                                  "--source", "s", "--licence", "CC0", *flags)
    assert code == 2 and "exists already" in err
    code, _, err = await novelbus("novel", "references", open_id, "remove", "nope", *flags)
    assert code == 2 and "no reference 'nope'" in err and "voice-1" in err
    code, _, err = await novelbus("novel", "references", open_id, "remove", "voice-1", *flags)
    assert code == 0, err
    code, out, _ = await novelbus("novel", "references", open_id, "list", "--json", *flags)
    assert json.loads(out)["references"] == []
