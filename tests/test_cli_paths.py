"""OPS-5: a path the user gives for output is checked before the command starts anything (a demo
or a benchmark would otherwise run to the end and then fail to write), and a file is written
whole or not at all: `export --out DIR`, `schema --out DIR`, `demo --out FILE` and
`bench ab --out FILE` get one line naming the problem, not a traceback (and the last two before
their whole run, not after it)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import typer

from novelbus.cli.common import output_problem, write_output

REPO = Path(__file__).resolve().parents[1]


def test_output_problem_names_what_is_in_the_way(tmp_path: Path) -> None:
    """OPS-5"""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    assert output_problem(tmp_path / "new" / "deeper" / "x.md") is None  # parents are created
    assert output_problem(tmp_path / "a-file") is None  # replaced
    assert output_problem(tmp_path / "a-dir") == f"{tmp_path / 'a-dir'} is a directory, not a file"
    assert output_problem(tmp_path / "a-file" / "x.md") == f"{tmp_path / 'a-file'} is a file, not a directory"
    assert output_problem(tmp_path / "a-dir", directory=True) is None
    assert output_problem(tmp_path / "new" / "dir", directory=True) is None
    assert output_problem(tmp_path / "a-file", directory=True) == f"{tmp_path / 'a-file'} is a file, not a directory"
    assert output_problem(tmp_path / "a-file" / "d", directory=True) == (
        f"{tmp_path / 'a-file'} is a file, not a directory")


def test_write_output_is_whole_or_nothing(tmp_path: Path) -> None:
    """OPS-5"""
    target = tmp_path / "sub" / "out.md"
    write_output(target, "first")
    write_output(target, "second")
    assert target.read_text() == "second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.md"]  # no temporary left
    (tmp_path / "blocker").write_text("keep")
    with pytest.raises(typer.Exit) as caught:
        write_output(tmp_path / "blocker" / "out.md", "lost?")
    assert caught.value.exit_code == 2 and (tmp_path / "blocker").read_text() == "keep"


async def novelbus(home: Path, *args: str) -> tuple[int, str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home.parent), "COLUMNS": "200",
           # unreachable servers: a command that got past its checks would fail differently
           "NOVELBUS_NATS_URL": "nats://127.0.0.1:1", "NOVELBUS_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, cwd=REPO, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


CASES = [
    (("export", "n-1", "--home", "{home}", "--out", "{dir}"), "{dir} is a directory, not a file"),
    (("export", "n-1", "--home", "{home}", "--out", "{file}/x.md"), "{file} is a file, not a directory"),
    (("schema", "--out", "{dir}"), "{dir} is a directory, not a file"),
    (("demo", "--home", "{home}", "--out", "{file}"), "{file} is a file, not a directory"),
    (("bench", "ab", "--home", "{home}", "--chapters", "1", "--scenes", "1", "--out", "{file}"),
     "{file} is a file, not a directory"),
]


@pytest.mark.parametrize(("args", "said"), CASES, ids=[" ".join(a[:2]) for a, _ in CASES])
async def test_an_unwritable_out_exits_2_before_anything_starts(args: tuple[str, ...], said: str,
                                                                    tmp_path: Path) -> None:
    """OPS-5"""
    home = tmp_path / "home"
    paths = {"dir": str(tmp_path / "a-dir"), "file": str(tmp_path / "a-file"), "home": str(home)}
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("keep")
    code, out, err = await novelbus(home, *(a.format(**paths) for a in args))
    assert code == 2, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [f"error: --out: {said.format(**paths)}"]
    assert (tmp_path / "a-file").read_text() == "keep" and not home.exists()


async def test_schema_out_creates_missing_directories(tmp_path: Path) -> None:
    """OPS-5"""
    target = tmp_path / "new" / "schema.json"
    code, out, err = await novelbus(tmp_path / "home", "schema", "--out", str(target))
    assert code == 0, err
    assert out.strip() == str(target) and "workNotice" in json.loads(target.read_text())["properties"]
