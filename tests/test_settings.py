"""OPS-4 / OPS-5: every `NOVELBUS_*` setting is either checked before a command starts anything
(a malformed value: exit 2, one line naming the variable, no traceback, no server started) or
listed as free-form with the reason, and every one is in the README. The benchmarks' flags are
refused the same way.

The scan reads the package's sources, so a setting added without a checker or a reason fails
here rather than with a traceback in a user's first run."""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from pathlib import Path

import pytest
import trustme

from novelbus.cli.common import FREE_FORM_SETTINGS, check_environment, checked_settings

REPO = Path(__file__).resolve().parents[1]


def _ca_file() -> str:
    """A CA certificate in PEM, made for this run (trustme, the TLS test's CA maker)."""
    path = Path(tempfile.mkdtemp(prefix="novelbus-ca-")) / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return str(path)

PACKAGE_DIRS = sorted(p.name for p in (REPO / "novelbus").iterdir() if p.is_symlink())
NAME = re.compile(r"NOVELBUS_[A-Z0-9_]*[A-Z0-9_]")
# Names in the sources that are not settings.
NOT_SETTINGS = {
    "NOVELBUS_WORK": "a stream's name (messages/subjects.py)",
    "NOVELBUS_EVENTS": "a stream's name",
    "NOVELBUS_DLQ": "a stream's name",
    "NOVELBUS_INFRA_READY": "the prefix of the line `python -m novelbus.infra` prints when ready",
    "NOVELBUS_NATS_": "NOVELBUS_NATS_<USER>_PASSWORD of deploy/nats.conf (bus.permissions), read by nats-server",
}

# A malformed value of each checked setting, and one the README's tables allow.
MALFORMED = {
    "NOVELBUS_DB_POOL_SIZE": "lots",
    "NOVELBUS_STREAM_REPLICAS": "9",
    "NOVELBUS_EVENTS_MAX_AGE_DAYS": "forever",
    "NOVELBUS_MAX_OUTPUT_TOKENS": "3",
    "NOVELBUS_MODEL_TOOL_CHOICE": "sometimes",
    "NOVELBUS_MODEL_CONTEXT_WINDOW": "8k",
    "NOVELBUS_MODEL_STRUCTURED": "xml",
    "NOVELBUS_INLINE_COMPACT_TOKENS": "0",
    "NOVELBUS_READ_TOOLS": "maybe",
    "NOVELBUS_LOCAL_THREADS": "all",
    "NOVELBUS_MODEL_TIMEOUT_S": "0",
    "NOVELBUS_MODEL_MAX_TOKENS_FIELD": "max_output",
    "NOVELBUS_RAW_VAULT": "/dev/null",
    "NOVELBUS_SERVING_LEASE_S": "0",
    "NOVELBUS_CACHE_AFFINITY": "sometimes",
    "NOVELBUS_ENDPOINTS_FILE": "/nonexistent/endpoints.json",
    "NOVELBUS_MIGRATE": "sometimes",
    "NOVELBUS_LOG_FORMAT": "xml",
    "NOVELBUS_LOG_LEVEL": "loud",
    "NOVELBUS_LOG_LEVELS": "novelbus.bus:DEBUG",
    "NOVELBUS_NATS_TLS_CA": str(REPO / "README.md"),  # a file, but no certificate in it
    "NOVELBUS_NATS_TLS_CERT": "/nonexistent/client.pem",
    "NOVELBUS_NATS_TLS_KEY": "/nonexistent/client.key",
}
WELL_FORMED = {
    "NOVELBUS_DB_POOL_SIZE": "9",
    "NOVELBUS_STREAM_REPLICAS": "3",
    "NOVELBUS_EVENTS_MAX_AGE_DAYS": "90",
    "NOVELBUS_MAX_OUTPUT_TOKENS": "2048",
    "NOVELBUS_MODEL_TOOL_CHOICE": "forced",
    "NOVELBUS_MODEL_CONTEXT_WINDOW": "32768",
    "NOVELBUS_MODEL_STRUCTURED": "json_object",
    "NOVELBUS_INLINE_COMPACT_TOKENS": "50000",
    "NOVELBUS_READ_TOOLS": "off",
    "NOVELBUS_LOCAL_THREADS": "2",
    "NOVELBUS_MODEL_TIMEOUT_S": "300",
    "NOVELBUS_MODEL_MAX_TOKENS_FIELD": "max_completion_tokens",
    "NOVELBUS_RAW_VAULT": "/tmp/novelbus-raw-vault-settings-test",
    "NOVELBUS_SERVING_LEASE_S": "20",
    "NOVELBUS_CACHE_AFFINITY": "off",
    "NOVELBUS_ENDPOINTS_FILE": str(REPO / "examples" / "endpoints.json"),
    "NOVELBUS_MIGRATE": "check",
    "NOVELBUS_LOG_FORMAT": "json",
    "NOVELBUS_LOG_LEVEL": "warning",
    "NOVELBUS_LOG_LEVELS": "novelbus.bus=DEBUG,nats=WARNING",
    "NOVELBUS_NATS_TLS_CA": _ca_file(),  # a CA certificate in PEM
    # Readable files, both set: whether they are a certificate and its key is found when connecting
    "NOVELBUS_NATS_TLS_CERT": str(REPO / "README.md"),
    "NOVELBUS_NATS_TLS_KEY": str(REPO / "README.md"),
}


def names_in_sources() -> set[str]:
    found: set[str] = set()
    for d in PACKAGE_DIRS:
        for path in (REPO / d).rglob("*.py"):
            found.update(NAME.findall(path.read_text(encoding="utf-8")))
    return found - set(NOT_SETTINGS)


def test_every_setting_in_the_sources_is_checked_or_free_form() -> None:
    """OPS-5"""
    found = names_in_sources()
    checked, free = set(checked_settings()), set(FREE_FORM_SETTINGS)
    assert not checked & free
    assert found == checked | free, (
        f"neither checked nor free-form: {sorted(found - checked - free)}; "
        f"listed but read nowhere: {sorted((checked | free) - found)}")


def test_every_checked_setting_has_a_malformed_and_a_well_formed_example() -> None:
    """OPS-5"""
    assert set(MALFORMED) == set(checked_settings()) == set(WELL_FORMED)


def test_every_setting_is_in_the_readme() -> None:
    """OPS-4: every setting is documented — in the README or a page of the docs site."""
    readme = "\n".join(p.read_text(encoding="utf-8")
                       for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    missing = [n for n in [*checked_settings(), *FREE_FORM_SETTINGS]
               if (n + "<ACTOR>" if n.endswith("_") else n) not in readme]
    assert not missing


def test_well_formed_values_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-5"""
    for name, value in WELL_FORMED.items():
        monkeypatch.setenv(name, value)
    check_environment()
    assert checked_settings()["NOVELBUS_LOCAL_THREADS"]() == 2
    assert checked_settings()["NOVELBUS_READ_TOOLS"]() is False


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_setting_is_refused_naming_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-5"""
    monkeypatch.setenv(name, MALFORMED[name])
    with pytest.raises(Exception) as caught:
        checked_settings()[name]()
    assert name in str(caught.value)


async def novel_list(home: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`novelbus novel list` (or `args`) with only `env`: without server URLs it would start
    embedded servers."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *(args or ("novel", "list")), "--home", str(home),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "HOME": str(home.parent), "COLUMNS": "200", **env})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_a_malformed_setting_exits_2_before_anything_starts(name: str, tmp_path: Path) -> None:
    """OPS-5"""
    code, out, err = await novel_list(tmp_path / "home", {name: MALFORMED[name]})
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {name} must be"), err
    assert MALFORMED[name] in lines[0]  # what was given, so the user sees the typo
    assert not out and not (tmp_path / "home").exists()  # nothing started, nothing written


SECRET = "pw-7f3a9c"
MALFORMED_URLS = {
    "NOVELBUS_NATS_URL": (f"http://u:{SECRET}@127.0.0.1:4222", "must start with nats://"),
    "NOVELBUS_DATABASE_URL": (f"postgresql://u:{SECRET}@127.0.0.1:54x2/db", "the port in '127.0.0.1:54x2'"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_URLS))
async def test_a_malformed_server_url_exits_2_without_its_password(name: str, tmp_path: Path) -> None:
    """OPS-5: A traceback from inside the client library before (a port that is not a number)."""
    url, why = MALFORMED_URLS[name]
    other = {"NOVELBUS_NATS_URL": "nats://127.0.0.1:1", "NOVELBUS_DATABASE_URL": "postgresql://127.0.0.1:1/db"}
    code, out, err = await novel_list(tmp_path / "home", {**other, name: url})
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --") and name in lines[0] and why in lines[0], err
    assert SECRET not in err + out and not (tmp_path / "home").exists()


BAD_BENCH_FLAGS = [
    (("bench", "throughput", "--novels", "0"), "--novels must be at least 1, got 0"),
    (("bench", "throughput", "--timeout", "0"), "--timeout must be positive, got 0.0"),
    # Below about 20 characters the offline writer overshoots the length band: novels paused
    # `awaiting-approval` and the bench failed after starting its servers.
    (("bench", "throughput", "--unit-chars", "10"), "--unit-chars must be at least 50, got 10"),
    (("bench", "ab", "--unit-chars", "10"), "--unit-chars must be at least 50, got 10"),
    (("bench", "ab", "--usage-threshold-ratio", "1.5"), "--usage-threshold-ratio must be in (0, 1], got 1.5"),
]


@pytest.mark.parametrize(("args", "said"), BAD_BENCH_FLAGS, ids=[" ".join(a[1:]) for a, _ in BAD_BENCH_FLAGS])
async def test_a_bad_bench_flag_exits_2_before_anything_starts(args: tuple[str, ...], said: str,
                                                                   tmp_path: Path) -> None:
    """OPS-5"""
    code, out, err = await novel_list(tmp_path / "home", {}, *args)
    assert code == 2, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [f"error: {said}"]
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("args", [("demo",), ("bench", "chaos"), ("bench", "cluster"), ("probe", "--model", "offline")],
                         ids=["demo", "bench chaos", "bench cluster", "probe"])
async def test_a_timeout_that_is_not_positive_exits_2_before_anything_starts(args: tuple[str, ...],
                                                                                 tmp_path: Path) -> None:
    """OPS-5: `--timeout 0` ran a whole demo or chaos run that could only fail, and made `probe` end in a
    traceback; typer now refuses it (its usage box, exit 2)."""
    home = tmp_path / "home"
    code, _, err = await novel_list(home, {}, *args, "--timeout", "0")
    assert code == 2, err
    assert "Invalid value for '--timeout'" in err and "greater than or equal to 0.1" in err
    assert not home.exists()
