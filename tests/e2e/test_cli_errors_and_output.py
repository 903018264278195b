"""OPS-5 (and OPS-4): the CLI's rough edges found when tried as a new user would, each reproduced
as a subprocess against real NATS + PostgreSQL (the session's, or embedded ones under a home)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.client import connect
from novelbus.bus.codec import encode
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.novel import outline as outline_mod
from novelbus.novel import pack as pack_mod
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.waiting import arrives, wait_until

REPO = Path(__file__).resolve().parents[2]


def _env(extra: dict[str, str] | None = None, *, columns: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_") and k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = "200"
    return {**env, **(extra or {})}


async def novelbus(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, cwd=REPO, env=env or _env())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"novelbus {' '.join(args)} did not exit within {timeout} s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _flags(stack: Runtime, nats_url: str) -> list[str]:
    dsn = stack.ctx.pool._connect_args[0]  # type: ignore[attr-defined]
    return ["--nats-url", nats_url, "--database-url", dsn, "--namespace", stack.ctx.subjects.namespace]


def _sample(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sample_novel_bytes())
    data["config"]["writerMode"] = "inline"  # no probe needed
    data.update(changes)
    return data


def _write(tmp_path: Path, name: str, data: Any) -> Path:
    """`data` as a file: text, bytes, JSON of anything else; None: a directory of that name."""
    path = tmp_path / name
    if data is None:
        path.mkdir()
    elif isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- monitor ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["bad id!", "*", "n-1.>"])
async def test_monitor_refuses_what_is_not_a_novel_id(bad: str) -> None:
    """OPS-5: `--novel 'bad id!'` printed a Rich traceback (invalid subject); `'*'` was accepted."""
    code, _, err = await novelbus("monitor", "--novel", bad, env=_env(
        {"NOVELBUS_NATS_URL": "nats://127.0.0.1:1", "NOVELBUS_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}))
    assert code == 2, err
    assert "is not a novel id" in err and repr(bad) in err and "hint:" in err
    assert "Traceback" not in err and "ServerError" not in err


async def test_monitor_of_an_unknown_novel_says_so(stack: Runtime, nats_url: str) -> None:
    """OPS-5: `monitor --novel n-nope` waited forever without a word."""
    code, _, err = await novelbus("monitor", "--novel", "n-nope", *_flags(stack, nats_url), timeout=30)
    assert code == 2 and "novel-not-found" in err and "n-nope" in err


async def test_monitor_count_exits_promptly_and_cleanly(stack: Runtime, nats_url: str) -> None:
    """OPS-5: `monitor --count 5` replayed at once, then waited out the NATS drain timeout (5 s) and printed
    DrainTimeoutError (or `_GatheringFuture exception was never retrieved`)."""
    novel_id, _ = await run_novel(stack, parse_novel_file(json.dumps(_sample())))
    flags = _flags(stack, nats_url)
    started = time.monotonic()
    code, _, _ = await novelbus("status", novel_id, *flags)
    connect_s = time.monotonic() - started  # what any command takes to start, connect and leave
    assert code == 0
    for args in (["--json"], []):
        started = time.monotonic()
        code, out, err = await novelbus("monitor", "--novel", novel_id, "--count", "5", *args, *flags)
        took = time.monotonic() - started
        assert code == 0, err
        assert err.strip() == "", err  # no DrainTimeoutError, no never-retrieved future
        assert len(out.strip().splitlines()) == 5
        # it does not wait out the 5 s drain timeout on top of what a command takes anyway
        assert took < connect_s + 4.0, (took, connect_s)


# --- interrupts ---------------------------------------------------------------------------------
async def _printed_once_following(proc: asyncio.subprocess.Process, nats_url: str) -> None:
    """Until the monitor `proc` prints an event published on its servers: it is then connected
    and following the stream (it replays what it missed, so publishing early is fine)."""
    nc = await connect(nats_url, name="test-ready")
    try:
        data, headers = encode(ev.NovelFinished(novel_id="n-ready", units=0, commits=0, characters=0))
        subject = Subjects("").event("n-ready", tag_of(ev.NovelFinished))

        async def stored() -> bool:  # the monitor creates the stream once connected
            try:
                await nc.jetstream().publish(subject, data, headers=headers)
            except (nats.errors.Error, TimeoutError):  # no stream yet: no responders, or no answer
                return False
            return True

        await wait_until(stored, 60, "the monitor's event stream")
    finally:
        await nc.close()
    assert proc.stdout is not None
    line = await arrives(proc.stdout.readline(), 60, "the monitor printing the event")
    assert b"n-ready" in line, line


async def _interrupt(args: list[str], env: dict[str, str], ready: str | Path) -> tuple[int, str]:
    """Start a command, wait until it is under way (a first line on stdout containing `ready`, or
    the file `ready` exists), then press Ctrl-C."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, cwd=REPO, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        if isinstance(ready, Path):
            await wait_until(lambda: ready.exists() or proc.returncode is not None, 60, f"{ready} written")
            assert proc.returncode is None
            await _printed_once_following(proc, json.loads(ready.read_text())["natsUrl"])
        else:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert ready in line.decode(), line
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_interrupting_an_attached_command_does_not_claim_it_stopped_servers(
        stack: Runtime, nats_url: str, tmp_home: Path) -> None:
    """OPS-5: An interrupted command attached to running servers says "interrupted" only (it
    stopped none); one that started embedded servers itself says it stopped them."""
    novel_id, _ = await run_novel(stack, parse_novel_file(json.dumps(_sample())))
    code, err = await _interrupt(["monitor", "--novel", novel_id, *_flags(stack, nats_url)], _env(), novel_id)
    assert code == 130 and "interrupted" in err and "servers stopped" not in err, err

    code, err = await _interrupt(["monitor", "--home", str(tmp_home)], _env(), tmp_home / "endpoints.json")
    assert code == 130 and "interrupted; servers stopped" in err, err


# --- piped output -------------------------------------------------------------------------------
async def test_piped_output_is_not_wrapped(stack: Runtime, nats_url: str) -> None:
    """OPS-5: Piped output was hard-wrapped at 80 columns, splitting errors and event lines mid-word."""
    novel_id, _ = await run_novel(stack, parse_novel_file(json.dumps(_sample())))
    env = _env(columns=False)  # no COLUMNS: what a user's pipe gets
    code, out, _ = await novelbus("monitor", "--novel", novel_id, "--count", "8", *_flags(stack, nats_url), env=env)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 8, out
    assert all(line.startswith(f"{novel_id} ") for line in lines), out
    assert max(len(line) for line in lines) > 80  # long lines exist and stayed whole

    long_id = "n-" + "x" * 90
    code, _, err = await novelbus("status", long_id, *_flags(stack, nats_url), env=env)
    assert code == 2
    assert f"error: novel-not-found: novel '{long_id}' not found" in err.splitlines(), err


# --- not found, nothing happens, nothing there --------------------------------------------------
async def test_usage_of_an_unknown_novel_is_not_found(stack: Runtime, nats_url: str) -> None:
    """OPS-5: `usage n-nope` printed an empty table and exited 0; now it fails like `status`."""
    code, out, err = await novelbus("usage", "n-nope", *_flags(stack, nats_url))
    assert code == 2 and "novel-not-found" in err and out == ""
    code, out, err = await novelbus("usage", "n-nope", "--json", *_flags(stack, nats_url))
    assert code == 2 and "novel-not-found" in err and out == ""


async def test_notice_on_a_paused_or_finished_novel_says_why(stack: Runtime, nats_url: str) -> None:
    """OPS-5: `notice` on a paused or finished novel printed a notice id, exit 0, and nothing happened."""
    finished, _ = await run_novel(stack, parse_novel_file(json.dumps(_sample())))
    paused = await store.create_novel(stack.ctx.pool, parse_novel_file(json.dumps(_sample())))
    assert await store.pause_novel(stack.ctx.pool, paused, "user-request")
    seen: list[bytes] = []

    async def on_notice(msg: Any) -> None:
        seen.append(msg.data)

    sub = await stack.ctx.nc.subscribe(stack.ctx.subjects.work_all, cb=on_notice)
    try:
        code, out, err = await novelbus("notice", finished, *_flags(stack, nats_url))
        assert code == 2 and out == "" and f"novel {finished} is finished" in err and "hint:" in err
        code, out, err = await novelbus("notice", paused, *_flags(stack, nats_url))
        assert code == 2 and out == "" and f"novel {paused} is paused (user-request)" in err
        assert f"novel resume {paused}" in err
        await stack.ctx.nc.flush()
        assert seen == []  # nothing was published

        await store.resume_novel(stack.ctx.pool, paused)
        code, out, err = await novelbus("notice", paused, *_flags(stack, nats_url))
        assert code == 0 and out.strip().startswith("notice-"), err
        await stack.ctx.nc.flush()
        assert len(seen) >= 1  # an active novel's notice still goes out
    finally:
        await sub.unsubscribe()


async def test_list_and_export_say_when_there_is_nothing(stack: Runtime, nats_url: str) -> None:
    """OPS-5: `novel list` with no novels printed nothing; `export` before any commit wrote only the title."""
    flags = _flags(stack, nats_url)
    code, out, err = await novelbus("novel", "list", *flags)
    assert code == 0 and out == "" and "no novels yet" in err and "novel create" in err

    novel_id = await store.create_novel(stack.ctx.pool, parse_novel_file(json.dumps(_sample())))
    code, out, err = await novelbus("export", novel_id, *flags)
    assert code == 0 and out.startswith("# The Keeper's Ledger")  # stdout stays the Markdown
    assert "no committed prose yet" in err and "only its title" in err

    code, out, err = await novelbus("novel", "list", *flags)
    assert code == 0 and novel_id in out and "no novels" not in err


async def test_create_with_nothing_running_says_how_to_start(
        stack: Runtime, nats_url: str, new_database: Any, tmp_path: Path, tmp_home: Path) -> None:
    """OPS-5: `novel create` with nothing running created an active novel nothing writes, silently."""
    path = _write(tmp_path, "novel.json", _sample())
    # servers without actors
    bare = ["--nats-url", nats_url, "--database-url", await new_database(), "--namespace", "t-bare."]
    code, out, err = await novelbus("novel", "create", str(path), *bare)
    assert code == 0 and out.strip().startswith("n-"), err
    assert "nothing is running to write" in err and "novelbus up" in err
    # no servers at all: the command starts embedded ones for its own run, under --home
    code, out, err = await novelbus("novel", "create", str(path), "--home", str(tmp_home))
    assert code == 0 and out.strip().startswith("n-"), err
    assert "nothing is running to write" in err and f"novelbus up --home {tmp_home}" in err
    # actors running: no note
    code, out, err = await novelbus("novel", "create", str(path), *_flags(stack, nats_url))
    assert code == 0 and "nothing is running" not in err, err


# --- novel files --------------------------------------------------------------------------------
async def test_create_refuses_fields_over_the_pack_limits(stack: Runtime, nats_url: str,
                                                              tmp_path: Path) -> None:
    """OPS-5: A 100,000-character title was accepted, then every unit failed `pack-error … missing blocks:
    story, chapter, scene` without naming it: the §7 field limits hold at create, naming the field."""
    data = _sample(title="A" * 100_000)
    data["outline"]["scenes"][2]["goal"] = "g" * 301
    path = _write(tmp_path, "long.json", data)
    code, _, err = await novelbus("novel", "create", str(path), *_flags(stack, nats_url))
    assert code == 2
    assert "title: 100,000 characters, over the limit of 400" in err
    assert "outline.scenes[2].goal: 301 characters, over the limit of 300" in err
    assert len(err.split("; ")) == 2  # one item per field: `path: what is wrong`
    assert "A" * 100 not in err  # the field is named, not printed
    assert await store.list_novels(stack.ctx.pool) == []

    ok = _sample(title="A" * 400)
    ok["outline"]["scenes"][2]["goal"] = "g" * 300
    code, _, err = await novelbus("novel", "create", str(_write(tmp_path, "edge.json", ok)), *_flags(stack, nats_url))
    assert code == 0, err


def _top_level_layers() -> dict[str, Any]:
    data = _sample()
    data.update(data.pop("outline"))
    return data


def _relations_as_strings() -> dict[str, Any]:
    data = _sample()
    data["outline"]["characters"][0]["relations"] = ["Mira's brother"]
    return data


def _bad_chapter_id() -> dict[str, Any]:
    data = _sample()
    data["outline"]["chapters"][0]["chapterId"] = "chapter one"
    return data


@pytest.mark.parametrize(("content", "expected", "not_expected"), [
    (_relations_as_strings, ['outline.characters[0].relations[0]: expected an object {"characterId": …, '
                             '"description": …}, got a string'], ["Mira's brother"]),
    (_top_level_layers, ['story, chapters, scenes, characters, lore, foreshadowing: not fields of a novel file, '
                         'the outline layers belong under "outline"'], ["Extra inputs", "Field required"]),
    (lambda: "", ["the file is empty"], ["line 1 column 1"]),
    (lambda: " \n", ["the file is empty"], ["line 1 column 1"]),
    (_bad_chapter_id, ["outline.chapters[0].chapterId: 'chapter one' is not a valid id"], []),
    (lambda: [1, 2], ["a novel file is one JSON object", "not a list"], []),
    (lambda: b'{"title": "Caf\xe9"}', ["not UTF-8 text (invalid continuation byte at byte 14)"], ["Traceback"]),
    (lambda: None, ["is a directory, not a file"], ["Traceback"]),  # a directory where the file was
])
async def test_novel_file_errors_say_what_is_expected(tmp_path: Path, content: Any, expected: list[str],
                                                          not_expected: list[str]) -> None:
    """OPS-5: Relations as strings, outline layers at the top level, an empty file, an id failing its
    pattern, bytes that are not UTF-8, a directory: each error says what shape is expected (and
    shows the id), never with a traceback."""
    path = _write(tmp_path, "novel.json", content())
    code, _, err = await novelbus("novel", "create", str(path), env=_env(
        {"NOVELBUS_NATS_URL": "nats://127.0.0.1:1", "NOVELBUS_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"},
        columns=False))
    assert code == 2
    text = " ".join(err.split())
    for part in expected:
        assert part in text, err
    for part in not_expected:
        assert part not in text, err


def test_field_limits_are_the_pack_limits() -> None:
    """OPS-5: The create-time limits are the writer pack's (SPEC §7), not a second set of figures."""
    for name in ("STORY_FIELD_LIMIT", "CHAPTER_FIELD_LIMIT", "SCENE_FIELD_LIMIT", "FORESHADOWING_LIMIT"):
        assert getattr(outline_mod, name) == getattr(pack_mod, name), name


# --- status -------------------------------------------------------------------------------------
async def test_status_names_what_writer_output_chars_counts(stack: Runtime, nats_url: str) -> None:
    """OPS-5"""
    novel_id, _ = await run_novel(stack, parse_novel_file(json.dumps(_sample())))
    code, out, _ = await novelbus("status", novel_id, *_flags(stack, nats_url))
    line = next(li for li in out.splitlines() if li.startswith("writerOutputChars"))
    assert code == 0 and "tool-call" in line and "characters" in line
    code, out, _ = await novelbus("status", novel_id, "--json", *_flags(stack, nats_url))
    info = json.loads(out)
    assert info["writerOutputChars"] > info["characters"] > 0  # the figure the note explains


async def test_long_titles_are_cut_to_one_line_in_list_and_status(stack: Runtime, nats_url: str) -> None:
    """OPS-5: Titles from before the limit (or from the store directly) print on one line, cut with "…"."""
    nf = parse_novel_file(json.dumps(_sample()))
    novel_id = await store.create_novel(stack.ctx.pool, nf.model_copy(update={"title": "T" * 5_000}))
    code, out, _ = await novelbus("novel", "list", *_flags(stack, nats_url))
    assert code == 0 and novel_id in out and len(out.splitlines()[0]) < 200 and out.rstrip().endswith("…")
    code, out, _ = await novelbus("status", novel_id, *_flags(stack, nats_url))
    title = next(li for li in out.splitlines() if li.startswith("title"))
    assert code == 0 and len(title) < 200 and title.endswith("…")


# --- optional plot ------------------------------------------------------------------------------
def test_matplotlib_is_an_optional_extra() -> None:
    """OPS-5"""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plot"])


async def test_bench_ab_without_matplotlib_writes_the_csv_and_says_how_to_plot(
        nats_url: str, new_database: Any, tmp_path: Path) -> None:
    """OPS-5: Without the `plot` extra, `bench ab` still runs: the CSV is written, the PNG is skipped with
    a word on how to get it, `--json` says `"png": null`."""
    without = "import sys; sys.modules['matplotlib'] = None; from novelbus.cli.main import app; app()"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", without, "bench", "ab", "--chapters", "1", "--scenes", "2", "--unit-chars", "400",
        "--json", "--nats-url", nats_url, "--database-url", await new_database(), "--out", str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO, env=_env())
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["png"] is None and Path(report["csv"]).exists()
    assert not list(tmp_path.glob("*.png"))
    assert "matplotlib is not installed" in err.decode() and "novelbus[plot]" in err.decode()


# --- progress on a terminal (OPS-4) -------------------------------------------------------------
BAR = "━"  # Rich draws its bars with it; none of our plain output uses it
CURSOR_HIDE = "\x1b[?25l"  # a live display hides the cursor while it draws


def _on_a_terminal(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run the CLI with stdout on a pseudo-terminal (as a user's shell has it); all it drew."""
    import pty
    import subprocess

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "novelbus.cli.main", *args], stdout=slave,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=REPO,
                            env={**env, "TERM": "xterm-256color"})
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert time.monotonic() < deadline, "the command did not finish"
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, b"".join(chunks).decode(errors="replace")


async def test_demo_shows_live_progress_on_a_terminal_and_none_when_piped(
        nats_url: str, new_database: Any, tmp_path: Path) -> None:
    """OPS-4: `demo` (with a real model it takes minutes) draws a live bar with the unit in flight on a
    terminal; piped, its output is the same plain lines as before."""
    flags = ["--nats-url", nats_url, "--database-url", await new_database(), "--namespace", "t-demo1.",
             "--out", str(tmp_path)]
    code, drawn = await asyncio.to_thread(_on_a_terminal, ["demo", *flags], _env())
    assert code == 0, drawn[-2000:]
    assert BAR in drawn and CURSOR_HIDE in drawn and "writing" in drawn and "/9" in drawn
    assert "finished in" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)

    flags = ["--nats-url", nats_url, "--database-url", await new_database(), "--namespace", "t-demo2.",
             "--out", str(tmp_path)]
    code, out, _ = await novelbus("demo", *flags, timeout=300)
    assert code == 0 and "finished in" in out
    assert BAR not in out and "\x1b[" not in out


async def test_probe_shows_a_spinner_on_a_terminal_but_json_stays_json(tmp_path: Path) -> None:
    """OPS-4"""
    code, drawn = await asyncio.to_thread(_on_a_terminal, ["probe", "--home", str(tmp_path)], _env())
    assert code == 0, drawn[-2000:]
    assert CURSOR_HIDE in drawn and "probing offline" in drawn and "model repl" in drawn
    code, drawn = await asyncio.to_thread(_on_a_terminal, ["probe", "--json", "--home", str(tmp_path)], _env())
    assert code == 0 and CURSOR_HIDE not in drawn
    assert set(json.loads(drawn)) >= {"P1", "P2", "P3", "P4", "P5"}


async def test_benches_show_progress_on_a_terminal_and_none_in_json(
        nats_url: str, new_database: Any, pg_admin_dsn: str, tmp_path: Path) -> None:
    """OPS-4: `bench pack`, `bench ab` and `bench throughput` draw live bars on a terminal; `--json` on a
    terminal prints one JSON object and nothing else."""
    pack = ["bench", "pack", "--units", "10", "--chapters", "2", "--repeats", "1", "--database-url", pg_admin_dsn]
    code, drawn = await asyncio.to_thread(_on_a_terminal, pack, _env())
    assert code in (0, 1), drawn[-2000:]  # a missed target exits 1; the progress is what is checked
    assert BAR in drawn and "latin: units" in drawn and "cjk: units" in drawn
    code, drawn = await asyncio.to_thread(_on_a_terminal, [*pack, "--json"], _env())
    assert BAR not in drawn and CURSOR_HIDE not in drawn and isinstance(json.loads(drawn), dict)

    ab = ["bench", "ab", "--chapters", "1", "--scenes", "2", "--unit-chars", "400", "--out", str(tmp_path),
          "--nats-url", nats_url, "--database-url", await new_database()]
    code, drawn = await asyncio.to_thread(_on_a_terminal, ab, _env())
    assert BAR in drawn and "inline: units" in drawn and "subagent: units" in drawn, drawn[-2000:]

    tp = ["bench", "throughput", "--novels", "2", "--chapters", "1", "--scenes", "2", "--latency-units", "2",
          "--nats-url", nats_url, "--database-url", await new_database()]
    code, drawn = await asyncio.to_thread(_on_a_terminal, tp, _env())
    assert BAR in drawn and "load: novels finished" in drawn, drawn[-2000:]
    code, drawn = await asyncio.to_thread(_on_a_terminal, [*tp, "--json"], _env())
    # 1: a PERF-2 guard failed (a busy test machine); the output is what is checked
    assert code in (0, 1) and BAR not in drawn and CURSOR_HIDE not in drawn and "units_per_s" in json.loads(drawn)


# --- servers that cannot be reached ---------------------------------------------------------------
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_servers_give_a_clear_error_without_credentials(
        nats_url: str, new_database: Any) -> None:
    """OPS-5: A wrong --database-url or --nats-url gets a one-paragraph error naming the server
    (host and port, never the password), exit 1, no traceback; NATS is waited for
    COMMAND_NATS_WAIT_S (15 s), not forever."""
    port = _closed_port()
    code, out, err = await novelbus("status", "n-1", "--nats-url", nats_url, "--database-url",
                                    f"postgresql://someone:pg-secret-1@127.0.0.1:{port}/nodb")
    assert code == 1, err
    assert f"PostgreSQL at 127.0.0.1:{port}/nodb" in err and "hint:" in err
    assert "Traceback" not in err and "pg-secret-1" not in err + out
    started = time.monotonic()
    code, out, err = await novelbus("status", "n-1", "--database-url", await new_database(), "--nats-url",
                                    f"nats://someone:nats-secret-2@127.0.0.1:{port}", timeout=90)
    took = time.monotonic() - started
    assert code == 1, err
    assert f"NATS at 127.0.0.1:{port} did not answer within 15 s" in err, err
    assert "ConnectionRefusedError" in err  # the last error, named
    assert "Traceback" not in err and "nats-secret-2" not in err + out
    assert took < 60, took
