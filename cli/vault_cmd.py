"""`novelbus vault list|purge` and `up --raw-vault DIR`: the raw vault (CTX-10, QUAL-5).

The vault is a directory of private files (`store.raw_vault`); these commands read and delete
them directly, with no server running. Output names paths, sizes, kinds and novel ids only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from novelbus.cli.common import console, fail, print_json
from novelbus.store.raw_vault import ENV_RAW_VAULT, RawVault, VaultError, raw_vault_from_env

vault_app = typer.Typer(no_args_is_help=True, help="The raw vault: list or purge kept writer calls (CTX-10).")

VaultOpt = Annotated[Path | None, typer.Option(
    "--raw-vault", help=f"The vault directory (env {ENV_RAW_VAULT})", show_default=False)]
NovelFilter = Annotated[str | None, typer.Option("--novel", help="Only this novel's files")]
OlderThan = Annotated[float | None, typer.Option(
    "--older-than", min=0, help="Only files older than this many days")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]


def open_vault(path: Path | None, *, required: bool = True) -> RawVault | None:
    """The vault at `path` (else NOVELBUS_RAW_VAULT), created 0700 when missing; exit 2 with one
    line when it cannot be written. None when neither names one and it is not `required`."""
    try:
        where = path if path is not None else raw_vault_from_env()
    except ValueError as e:
        fail(str(e), code=2)
    if where is None:
        if required:
            fail(f"no raw vault named: give --raw-vault DIR or set {ENV_RAW_VAULT}", code=2)
        return None
    try:
        return RawVault.open(where)
    except VaultError as e:
        fail(str(e), code=2)


def start_vault(path: Path | None) -> str | None:
    """`up --raw-vault DIR` (else NOVELBUS_RAW_VAULT): refused at start when it cannot be written
    (exit 2, one line); retention applied once; exported so `--processes` children keep it too.
    Returns the directory for the actors' settings, or None without a vault."""
    vault = open_vault(path, required=False)
    if vault is None:
        return None
    swept = vault.sweep()
    if swept.files:
        console.print(f"raw vault {vault.root}: retention {swept.line()}")
    os.environ[ENV_RAW_VAULT] = str(vault.root)
    return str(vault.root)


def _age(seconds: float) -> str:
    days = seconds / 86_400
    return f"{days:.1f} d" if days >= 1 else f"{seconds / 3600:.1f} h"


@vault_app.command("list")
def vault_list(raw_vault: VaultOpt = None, novel: NovelFilter = None, older_than: OlderThan = None,
               as_json: JsonOpt = False) -> None:
    """List the kept files: novel, kind (call | refused), size, age, path."""
    vault = open_vault(raw_vault)
    assert vault is not None
    now = time.time()
    try:
        entries = vault.entries(novel_id=novel, older_than_days=older_than, now=now)
    except VaultError as e:
        fail(str(e), code=2)
    total = sum(e.bytes for e in entries)
    novels = sorted({e.novel_id for e in entries})
    if as_json:
        print_json({"vault": str(vault.root), "files": len(entries), "bytes": total, "novels": novels,
                    "entries": [e.to_json() for e in entries]})
        return
    for e in entries:
        console.print(f"{e.novel_id}  {e.kind:<7}  {e.bytes:>9,} B  {_age(now - e.modified):>7}  {e.path}",
                      markup=False)
    console.print(f"{len(entries)} file{'s' if len(entries) != 1 else ''}, {total:,} bytes, "
                  f"{len(novels)} novel{'s' if len(novels) != 1 else ''} in {vault.root}", markup=False)


@vault_app.command("purge")
def vault_purge(raw_vault: VaultOpt = None, novel: NovelFilter = None, older_than: OlderThan = None,
                as_json: JsonOpt = False) -> None:
    """Delete the kept files (all, one novel's, or those older than DAYS) and print a receipt."""
    vault = open_vault(raw_vault)
    assert vault is not None
    try:
        receipt = vault.purge(novel_id=novel, older_than_days=older_than)
    except VaultError as e:
        fail(str(e), code=2)
    if as_json:
        print_json(receipt.to_json())
    else:
        console.print(receipt.line(), markup=False)
