"""The raw vault (CTX-10, QUAL-5): raw writer requests, replies and refused candidates, on disk.

Off unless both the deployment (`novelbus up --raw-vault DIR`, `NOVELBUS_RAW_VAULT`) and the
novel (`config.rawVault.enabled`) ask for it. Files, not the database: the vault lies outside
PostgreSQL, the bus, the event ledger and the logs — nothing here is ever published, and no log
line or error names anything but paths, counts and ids.

Layout: `DIR/<novelId>/<UTC time>-<runId>-<seq>-<kind>.json`, one JSON object per file, where
`kind` is `call` (one model call: the request as sent, the reply or the provider's error code)
or `refused` (a candidate the verifier refused, with its reason code). Directories are 0700,
files 0600, each written whole (a private temporary file renamed into place) or not at all.
`DIR/<novelId>/.retention` holds the novel's `retentionDays`; `sweep` deletes what is older.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from novelbus.novel.outline import is_valid_id

ENV_RAW_VAULT = "NOVELBUS_RAW_VAULT"
RETENTION_FILE = ".retention"
DAY_S = 86_400.0
SWEEP_EVERY_S = 3_600.0  # a novel's retention is applied on a write at most this often
Kind = Literal["call", "refused"]
KINDS: tuple[Kind, ...] = ("call", "refused")


class VaultError(Exception):
    """A vault directory that cannot be used, or a bad argument; the message names which."""


def _checked_path(raw: str, source: str) -> Path:
    path = Path(raw).expanduser()
    if path.exists() and not path.is_dir():
        raise VaultError(f"{source}: {path} is a file, not a directory")
    return path


def raw_vault_from_env(env: Mapping[str, str] | None = None) -> Path | None:
    """NOVELBUS_RAW_VAULT: the deployment's vault directory (None: no vault). Its form is checked
    here (ValueError naming it); whether it can be written, when a process opens it."""
    raw = ((os.environ if env is None else env).get(ENV_RAW_VAULT) or "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{ENV_RAW_VAULT} must be a directory; {raw} is a file")
    return path


@dataclass(frozen=True)
class VaultEntry:
    novel_id: str
    path: Path
    kind: str
    bytes: int
    modified: float  # seconds since the epoch

    def to_json(self) -> dict[str, Any]:
        return {"novelId": self.novel_id, "path": str(self.path), "kind": self.kind, "bytes": self.bytes,
                "modified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.modified))}


@dataclass(frozen=True)
class PurgeReceipt:
    files: int = 0
    bytes: int = 0
    novels: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "novels": list(self.novels)}

    def line(self) -> str:
        which = f" ({', '.join(self.novels)})" if self.novels else ""
        return (f"purged {self.files} file{'s' if self.files != 1 else ''}, {self.bytes:,} bytes, "
                f"{len(self.novels)} novel{'s' if len(self.novels) != 1 else ''}{which}")


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes, at: float | None = None) -> None:
    """`data` at `path`, mode 0600, whole or not at all: a private temporary file renamed over it.
    `at`: its modification time (retention counts from it)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if at is not None:
            os.utime(tmp, (at, at))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _check_novel(novel_id: str) -> None:
    if not is_valid_id(novel_id):
        raise VaultError(f"novel id {novel_id[:80]!r} is not a valid id")


@dataclass
class RawVault:
    root: Path
    _swept: dict[str, float] = field(default_factory=dict)  # novel -> when its retention last ran

    @classmethod
    def open(cls, root: Path | str) -> RawVault:
        """The vault at `root`, created (0700) when missing; VaultError when it cannot be written."""
        path = _checked_path(str(root), "raw vault")
        try:
            _private_dir(path)
            _write_private(path / f".write-check-{secrets.token_hex(4)}", b"")
            for probe in path.glob(".write-check-*"):
                probe.unlink(missing_ok=True)
        except OSError as e:
            raise VaultError(f"raw vault {path} cannot be written: {e.strerror or type(e).__name__}") from None
        return cls(path)

    # --- writing --------------------------------------------------------------------------------
    def _write(self, novel_id: str, run_id: str, seq: int, kind: Kind, record: dict[str, Any],
               retention_days: int, now: float | None = None) -> Path:
        _check_novel(novel_id)
        now = time.time() if now is None else now
        folder = self.root / novel_id
        _private_dir(folder)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        safe_run = run_id if is_valid_id(run_id) else "run"
        # a call is one per (run, seq); refusals may come twice a second for one run: a token apart
        tag = f"{seq:03d}" if kind == "call" else secrets.token_hex(3)
        path = folder / f"{stamp}-{safe_run}-{tag}-{kind}.json"
        body = {"kind": kind, "novelId": novel_id, "runId": run_id, "seq": seq,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), **record}
        _write_private(path, json.dumps(body, ensure_ascii=False, indent=1, default=str).encode(), now)
        retention = folder / RETENTION_FILE
        if not retention.exists() or retention.read_text().strip() != str(retention_days):
            _write_private(retention, str(retention_days).encode())
        if now - self._swept.get(novel_id, 0.0) >= SWEEP_EVERY_S:
            self._swept[novel_id] = now
            self.purge(novel_id=novel_id, older_than_days=retention_days, now=now)
        return path

    def store_call(self, *, novel_id: str, unit_id: str, run_id: str, seq: int, request: dict[str, Any],
                   reply: dict[str, Any] | None, error: dict[str, Any] | None, retention_days: int,
                   now: float | None = None) -> Path:
        """One writer call: the request as sent (messages, tools, options) and its reply, or the
        provider's error (code and message) when it had none."""
        record = {"unitId": unit_id, "request": request, "reply": reply, "error": error}
        return self._write(novel_id, run_id, seq, "call", record, retention_days, now)

    def store_refused_candidate(self, *, novel_id: str, unit_id: str, run_id: str, code: str,
                                candidate: Any, retention_days: int, detail: str | None = None,
                                seq: int = 0, now: float | None = None) -> Path:
        """A candidate the content gate (or any check) refused: the body and the reason code."""
        record = {"unitId": unit_id, "code": code, "detail": detail, "candidate": candidate}
        return self._write(novel_id, run_id, seq, "refused", record, retention_days, now)

    # --- reading and purging --------------------------------------------------------------------
    def _novel_dirs(self, novel_id: str | None) -> Iterator[Path]:
        if novel_id is not None:
            _check_novel(novel_id)
            folder = self.root / novel_id
            if folder.is_dir():
                yield folder
            return
        if self.root.is_dir():
            yield from sorted(p for p in self.root.iterdir() if p.is_dir() and is_valid_id(p.name))

    def entries(self, *, novel_id: str | None = None, older_than_days: float | None = None,
                now: float | None = None) -> list[VaultEntry]:
        """The vault's files, oldest first; only `novel_id`'s, only those older than the days."""
        if older_than_days is not None and older_than_days < 0:
            raise VaultError(f"--older-than must be 0 days or more, got {older_than_days}")
        now = time.time() if now is None else now
        found: list[VaultEntry] = []
        for folder in self._novel_dirs(novel_id):
            for path in folder.glob("*.json"):
                try:
                    st = path.stat()
                except FileNotFoundError:  # purged meanwhile
                    continue
                if older_than_days is not None and now - st.st_mtime < older_than_days * DAY_S:
                    continue
                kind = path.stem.rsplit("-", 1)[-1]
                found.append(VaultEntry(folder.name, path, kind if kind in KINDS else "other", st.st_size,
                                        st.st_mtime))
        return sorted(found, key=lambda e: (e.modified, str(e.path)))

    def purge(self, *, novel_id: str | None = None, older_than_days: float | None = None,
              now: float | None = None) -> PurgeReceipt:
        """Delete the matching files (all of a novel's when no age is given) and say what went."""
        files, size, novels = 0, 0, set[str]()
        for entry in self.entries(novel_id=novel_id, older_than_days=older_than_days, now=now):
            try:
                entry.path.unlink()
            except FileNotFoundError:
                continue
            files, size = files + 1, size + entry.bytes
            novels.add(entry.novel_id)
        for folder in self._novel_dirs(novel_id):  # a novel left with nothing goes whole
            if not any(folder.glob("*.json")):
                for leftover in folder.iterdir():
                    if leftover.is_file():
                        leftover.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    folder.rmdir()
        return PurgeReceipt(files, size, tuple(sorted(novels)))

    def sweep(self, now: float | None = None) -> PurgeReceipt:
        """Retention: each novel's files older than its `retentionDays` are deleted."""
        files, size, novels = 0, 0, set[str]()
        for folder in list(self._novel_dirs(None)):
            try:
                days = int((folder / RETENTION_FILE).read_text().strip())
            except (OSError, ValueError):
                continue  # no retention recorded: kept until purged
            got = self.purge(novel_id=folder.name, older_than_days=days, now=now)
            files, size = files + got.files, size + got.bytes
            novels.update(got.novels)
        return PurgeReceipt(files, size, tuple(sorted(novels)))
