"""`novelbus pack … --role R --json` on a finished novel (ROLE-1, CTX-8): each role's projection,
scanned for what the visibility table keeps from it (ROLE-1)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.roles import ROLES
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.e2e.test_pack_cli import flags, novelbus
from tests.roles_leaks import leaks

pytestmark = pytest.mark.timeout(300)


async def _finished(stack: Runtime) -> str:
    nf = parse_novel_file(sample_novel_bytes())
    nf = nf.model_copy(update={"config": nf.config.model_copy(update={"writerShape": "W1"})})
    novel_id, _ = await run_novel(stack, nf)
    assert (await store.get_novel(stack.ctx.pool, novel_id)).status == "finished"
    return novel_id


async def _secrets(stack: Runtime, novel_id: str) -> list[str]:
    """Strings of the trusted boundary that no projection may carry: claim, run and delegation
    ids, token and body hashes, context hashes of the novel's commits."""
    out: list[str] = []
    for c in await store.list_commits(stack.ctx.pool, novel_id):
        out += [c.claim_id, c.run_id, c.body_hash]
        if c.context_hash:
            out.append(c.context_hash)
    rows = await stack.ctx.pool.fetch("SELECT token_hash FROM commits WHERE novel_id = $1", novel_id)
    out += [r["token_hash"] for r in rows]
    return [s for s in out if s]


async def test_pack_role_json_prints_each_roles_projection_and_no_id_hash_or_token(
    stack: Runtime, nats_url: str
) -> None:
    """ROLE-1: for every role, `pack --role R --json` prints one object with `role` and
    `projection`; the projection holds no run, claim or delegation id, no hash or token of the
    store, no arm name for the judge, no path, and nothing committed after its asOf."""
    novel_id = await _finished(stack)
    units = [u.unit_id for u in await store.list_units(stack.ctx.pool, novel_id)]
    unit = units[5]
    secrets = await _secrets(stack, novel_id)
    commits = await store.list_commits(stack.ctx.pool, novel_id)
    later_prose = []
    for c in commits:
        row = await store.get_commit_for_unit(stack.ctx.pool, novel_id, c.unit_id)
        assert row is not None and row.body is not None
        later_prose.append((c.seq, c.unit_id, row.body.paragraphs))
    for role in ROLES:
        code, out, err = await novelbus("pack", novel_id, unit, "--role", role, "--json", *flags(stack, nats_url))
        assert code == 0, (role, err)
        info = json.loads(out)
        assert info["role"] == role and info["unitId"] == unit
        projection = info["projection"]
        assert projection, role
        text = json.dumps(projection, ensure_ascii=False)
        assert info["projectionChars"] > 0
        found = leaks(projection, secrets=secrets, judge=role == "judge")
        assert not found, (role, found)
        # no future: prose of commits after the role's asOf (the unit's own is the candidate of
        # detector and judge, and the pending prose of the extractor)
        for seq, owner, paragraphs in later_prose:
            if seq <= info["asOf"] or owner == unit:
                continue
            for p in paragraphs:
                assert p not in text, (role, owner)
    # without --json: the projection as indented JSON, then the metadata below a rule
    code, out, err = await novelbus("pack", novel_id, unit, "--role", "extractor", *flags(stack, nats_url))
    assert code == 0, err
    shown, _, meta = out.partition("\n" + "─" * 72 + "\n")
    assert "pendingProse" in json.loads(shown) and meta.startswith("role extractor")
    # the extractor reads the unit's own commit: another asOf is refused, naming why
    code, _, err = await novelbus("pack", novel_id, unit, "--role", "extractor", "--as-of", "1",
                                  *flags(stack, nats_url))
    assert code == 2 and "asOf is fixed" in err


async def test_pack_role_rejects_an_unknown_role_naming_the_allowed_values(stack: Runtime, nats_url: str) -> None:
    """ROLE-1: `--role nope` exits 2 and names the role and every allowed value."""
    code, _, err = await novelbus("pack", "n-x", "u0001", "--role", "nope", *flags(stack, nats_url))
    assert code == 2
    assert "nope" in err
    for role in ROLES:
        assert role in err


async def test_pack_role_reviews_a_candidate_file_instead_of_the_committed_body(
    stack: Runtime, nats_url: str, tmp_path: Path
) -> None:
    """ROLE-1: the detector reviews `--candidate FILE` when given; `--candidate` with a role that
    reviews nothing is refused (exit 2)."""
    novel_id = await _finished(stack)
    unit = (await store.list_units(stack.ctx.pool, novel_id))[2].unit_id
    path = tmp_path / "candidate.txt"
    path.write_text("A planted paragraph about the harbour bell.\n\nAnd a second one, quieter.\n")
    code, out, err = await novelbus("pack", novel_id, unit, "--role", "detector", "--candidate", str(path),
                                    "--json", *flags(stack, nats_url))
    assert code == 0, err
    info: dict[str, Any] = json.loads(out)
    assert info["candidate"] == "file"
    text = json.dumps(info["projection"])
    assert "planted paragraph about the harbour bell" in text
    committed = await store.get_commit_for_unit(stack.ctx.pool, novel_id, unit)
    assert committed is not None and committed.body is not None
    assert committed.body.paragraphs[0] not in text
    code, _, err = await novelbus("pack", novel_id, unit, "--role", "planner", "--candidate", str(path),
                                  *flags(stack, nats_url))
    assert code == 2 and "--candidate" in err
    assert re.search(r"detector", err)
