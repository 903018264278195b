"""QUAL-5 / CTX-10: the raw vault's files — private, whole, listed, purged with a true receipt, swept
by retention; the CLI's list and purge, and an unwritable vault refused at start."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from novelbus.store.raw_vault import DAY_S, RETENTION_FILE, RawVault, VaultError

NOW = 1_800_000_000.0
REQUEST = {"messages": [{"role": "user", "content": "write the bell scene"}], "tools": None}
REPLY = {"text": "The bell rang.", "stopReason": "completed"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def fill(vault: RawVault, novel: str, calls: int, *, days: int = 7, at: float = NOW,
         run: str = "run-abc") -> list[Path]:
    return [vault.store_call(novel_id=novel, unit_id="u-1", run_id=run, seq=i + 1, request=REQUEST,
                             reply=REPLY, error=None, retention_days=days, now=at) for i in range(calls)]


def age(paths: list[Path], days: float) -> None:
    for p in paths:
        os.utime(p, (NOW - days * DAY_S, NOW - days * DAY_S))


def test_a_call_and_a_refused_candidate_are_private_whole_files(tmp_path: Path) -> None:
    """QUAL-5: files 0600 in 0700 directories, each a whole JSON object, no temporary left."""
    vault = RawVault.open(tmp_path / "vault")
    call = fill(vault, "n-1", 1)[0]
    refused = vault.store_refused_candidate(novel_id="n-1", unit_id="u-1", run_id="run-abc", code="repetition",
                                            candidate={"paragraphs": ["same. same. same."]}, retention_days=7,
                                            now=NOW)
    assert mode(vault.root) == mode(vault.root / "n-1") == 0o700
    assert mode(call) == mode(refused) == 0o600
    body = json.loads(call.read_text())
    assert body["kind"] == "call" and body["request"] == REQUEST and body["reply"] == REPLY
    assert json.loads(refused.read_text())["code"] == "repetition"
    assert call.name.endswith("-run-abc-001-call.json") and refused.name.endswith("-refused.json")
    assert sorted(p.name for p in (vault.root / "n-1").iterdir() if p.name.startswith(".")) == [RETENTION_FILE]
    again = vault.store_refused_candidate(novel_id="n-1", unit_id="u-1", run_id="run-abc", code="no-letters",
                                          candidate={"paragraphs": ["..."]}, retention_days=7, now=NOW)
    assert again != refused and refused.exists()  # two refusals in one second: two files


def test_purge_deletes_what_matches_and_its_receipt_counts_it(tmp_path: Path) -> None:
    """QUAL-5: the receipt's files, bytes and novels are what was deleted; filters by novel and age."""
    vault = RawVault.open(tmp_path / "vault")
    a, b = fill(vault, "n-a", 3), fill(vault, "n-b", 2)
    age(a[:2], 10)
    listed = vault.entries(now=NOW)
    assert len(listed) == 5 and {e.kind for e in listed} == {"call"}
    old = vault.entries(older_than_days=5, now=NOW)
    assert [e.path for e in old] == sorted(a[:2], key=lambda p: p.name)

    receipt = vault.purge(older_than_days=5, now=NOW)
    assert (receipt.files, receipt.bytes, receipt.novels) == (2, sum(e.bytes for e in old), ("n-a",))
    assert not a[0].exists() and a[2].exists()

    sizes = sum(p.stat().st_size for p in b)
    receipt = vault.purge(novel_id="n-b", now=NOW)
    assert (receipt.files, receipt.bytes, receipt.novels) == (2, sizes, ("n-b",))
    assert not (vault.root / "n-b").exists() and (vault.root / "n-a").exists()
    assert receipt.line() == f"purged 2 files, {sizes:,} bytes, 1 novel (n-b)"

    receipt = vault.purge(now=NOW)
    assert (receipt.files, receipt.novels) == (1, ("n-a",)) and vault.entries(now=NOW) == []
    assert vault.purge(now=NOW).files == 0


def test_retention_sweep_deletes_each_novels_files_older_than_its_days(tmp_path: Path) -> None:
    """QUAL-5: the sweep keeps a novel's files younger than its retentionDays, deletes the older ones."""
    vault = RawVault.open(tmp_path / "vault")
    short, long = fill(vault, "n-short", 2, days=1), fill(vault, "n-long", 2, days=30)
    age([short[0], long[0]], 3)
    receipt = vault.sweep(now=NOW)
    assert (receipt.files, receipt.novels) == (1, ("n-short",))
    assert not short[0].exists() and short[1].exists() and long[0].exists() and long[1].exists()


def test_a_write_applies_the_novels_retention(tmp_path: Path) -> None:
    """QUAL-5: writing sweeps that novel's expired files (at most once an hour)."""
    vault = RawVault.open(tmp_path / "vault")
    old = fill(vault, "n-1", 1, days=2)
    age(old, 5)
    fresh = RawVault.open(vault.root)  # a new process: its first write sweeps
    fill(fresh, "n-1", 1, days=2, run="run-new")
    assert not old[0].exists() and len(fresh.entries(now=NOW)) == 1


def test_bad_arguments_and_an_unwritable_vault_are_refused_naming_them(tmp_path: Path) -> None:
    """QUAL-5: a path that is a file, a read-only directory, a bad novel id, a negative age."""
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(VaultError, match="is a file, not a directory"):
        RawVault.open(a_file)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(VaultError, match="cannot be written"):
            RawVault.open(locked / "vault")
    vault = RawVault.open(tmp_path / "vault")
    with pytest.raises(VaultError, match="not a valid id"):
        vault.purge(novel_id="../etc")
    with pytest.raises(VaultError, match="--older-than"):
        vault.entries(older_than_days=-1)


def novelbus(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "novelbus", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_vault_list_and_purge_commands_print_the_files_and_a_receipt(tmp_path: Path) -> None:
    """QUAL-5: `novelbus vault list|purge [--novel N] [--older-than DAYS] [--json]`."""
    vault = RawVault.open(tmp_path / "vault")
    a, b = fill(vault, "n-a", 2, at=time.time()), fill(vault, "n-b", 1, at=time.time())
    root = str(vault.root)
    listed = novelbus("vault", "list", "--raw-vault", root, "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert (data["files"], data["novels"]) == (3, ["n-a", "n-b"])
    assert data["bytes"] == sum(p.stat().st_size for p in a + b)
    assert {e["path"] for e in data["entries"]} == {str(p) for p in a + b}
    assert "The bell rang" not in listed.stdout  # names and sizes, never contents

    text = novelbus("vault", "list", "--novel", "n-b", env={"NOVELBUS_RAW_VAULT": root})
    assert text.returncode == 0 and text.stdout.strip().endswith(f"1 file, {b[0].stat().st_size:,} bytes, "
                                                                 f"1 novel in {root}")
    assert json.loads(novelbus("vault", "list", "--raw-vault", root, "--older-than", "1",
                               "--json").stdout)["files"] == 0

    size_a = sum(p.stat().st_size for p in a)
    purged = novelbus("vault", "purge", "--raw-vault", root, "--novel", "n-a", "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) == {"files": 2, "bytes": size_a, "novels": ["n-a"]}
    assert not any(p.exists() for p in a) and b[0].exists()
    size_b = b[0].stat().st_size
    rest = novelbus("vault", "purge", "--raw-vault", root)
    assert rest.stdout.strip() == f"purged 1 file, {size_b:,} bytes, 1 novel (n-b)"
    assert not b[0].exists()


def test_a_vault_that_cannot_be_used_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    """QUAL-5: `up --raw-vault FILE` exits 2 with one line before anything starts; so does a command
    given no vault at all."""
    a_file = tmp_path / "file"
    a_file.write_text("x")
    up = novelbus("up", "--home", str(tmp_path / "home"), "--raw-vault", str(a_file))
    lines = [ln for ln in up.stderr.splitlines() if ln.strip()]
    assert up.returncode == 2 and len(lines) == 1 and "is a file, not a directory" in lines[0], up.stderr
    assert not (tmp_path / "home").exists()  # no server was started
    none = novelbus("vault", "list", env={"NOVELBUS_RAW_VAULT": ""})
    assert none.returncode == 2 and "--raw-vault" in none.stderr


@pytest.mark.parametrize(("block", "field"), [
    ({"enabled": "yes"}, "rawVault.enabled"),
    ({"retentionDays": 0}, "rawVault.retentionDays"),
    ({"retentionDays": 1.5}, "rawVault.retentionDays"),
    ({"retentionDays": 5000}, "rawVault.retentionDays"),
    ({"keep": True}, "rawVault.keep"),
])
def test_a_bad_raw_vault_config_is_refused_naming_its_field(block: dict[str, object], field: str) -> None:
    """QUAL-5: config.rawVault is validated like every config field (create and `novel config --set`)."""
    from pydantic import ValidationError

    from novelbus.novel.outline import NovelConfig, describe_validation_error

    with pytest.raises(ValidationError) as err:
        NovelConfig.model_validate({"rawVault": block})
    assert describe_validation_error(err.value).startswith(f"{field}:")
    assert NovelConfig().rawVault.enabled is False  # off by default
