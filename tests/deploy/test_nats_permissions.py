"""OPS-9: deploy/nats.conf is what `bus.permissions` generates, and the generator places every
command subject. What the server then enforces is held on a real nats-server by
tests/e2e/test_permissions.py and tests/e2e/test_reader_permissions.py."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from novelbus.bus import permissions
from novelbus.bus.permissions import grants, nats_conf
from novelbus.infra.nats import nats_server_binary
from novelbus.messages.subjects import ACTOR_NAMES, Subjects

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "nats.conf"


def test_the_committed_nats_conf_is_the_generated_one() -> None:
    """OPS-9: a subject or user added to the code without regenerating the file fails here."""
    assert CONFIG.read_text(encoding="utf-8") == nats_conf(), (
        "deploy/nats.conf differs from bus.permissions: run `novelbus deploy nats-config --out deploy/nats.conf`")


def test_the_deploy_command_writes_and_checks_the_file(tmp_path: Path) -> None:
    """OPS-9: `novelbus deploy nats-config --out FILE` writes the generated file; `--check` exits 0
    when the file is current and 1, naming the command that fixes it, when it is not."""
    out = tmp_path / "nats.conf"
    cli = [sys.executable, "-m", "novelbus.cli.main", "deploy", "nats-config", "--out", str(out)]
    env = dict(os.environ, COLUMNS="200")
    subprocess.run(cli, check=True, capture_output=True, cwd=REPO, env=env, timeout=60)
    assert out.read_text(encoding="utf-8") == nats_conf()
    assert subprocess.run([*cli, "--check"], capture_output=True, cwd=REPO, env=env, timeout=60).returncode == 0
    out.write_text(nats_conf().replace('"novelbus.cmd.packs"', '"novelbus.cmd.>"', 1), encoding="utf-8")
    stale = subprocess.run([*cli, "--check"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert stale.returncode == 1 and "novelbus deploy nats-config --out" in stale.stderr, stale


def test_nats_server_accepts_the_generated_file(tmp_path: Path) -> None:
    """OPS-9: `nats-server -t` parses it (passwords from the environment, as in a deployment)."""
    path = tmp_path / "nats.conf"
    path.write_text(nats_conf(), encoding="utf-8")
    env = dict(os.environ, **{g.password_variable: "test-only" for g in grants()})
    checked = subprocess.run([str(nats_server_binary()), "-t", "-c", str(path)], capture_output=True, text=True,
                             env=env, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_each_command_subject_has_one_server_and_only_its_senders_publish_it() -> None:
    """OPS-9, OPS-3: a command is subscribed by one user and published only by the users that
    send it; nobody but the claim manager subscribes to commits, nobody but the writer sends them."""
    by_user = {g.user: g for g in grants()}
    assert set(by_user) == {*ACTOR_NAMES, "operator", "scheduler", "monitor"}
    s = Subjects()
    expected_server = {s.claims: "claims", f"{s.claims}.*": "claims", s.commit("*"): "claims",
                       s.packs: "packer", s.runs: "writer", s.verify: "verifier", s.usage: "usage",
                       s.steer: "driver"}
    for subject, server in expected_server.items():
        assert [u for u, g in by_user.items() if subject in g.subscribe] == [server], subject
    assert [u for u, g in by_user.items() if s.commit("*") in g.publish] == ["writer"]
    assert [u for u, g in by_user.items() if s.steer in g.publish] == ["operator"]
    assert [u for u, g in by_user.items() if g.responds] == [*ACTOR_NAMES]  # only servers answer requests


def test_no_user_may_delete_a_stream_and_the_readers_change_nothing() -> None:
    """OPS-9: no allow list holds a broad JetStream grant or a stream deletion; the scheduler
    publishes notices only, and the monitor only asks to read the events stream."""
    for g in grants():
        for subject in g.publish:
            assert "DELETE" not in subject or subject == "$JS.API.STREAM.MSG.DELETE.NOVELBUS_DLQ", (g.user, subject)
            assert subject not in ("$JS.API.>", "$JS.>", ">", "novelbus.>", "novelbus.cmd.>"), (g.user, subject)
    by_user = {g.user: g for g in grants()}
    assert by_user["scheduler"].publish == ("novel.work.>",)
    assert by_user["scheduler"].subscribe == ("_INBOX_scheduler.>",)
    monitor = by_user["monitor"]
    assert all(p.startswith("$JS.") and ("NOVELBUS_EVENTS" in p or p == "$JS.API.INFO") for p in monitor.publish)
    assert monitor.subscribe == ("_INBOX_monitor.>", "novel.events.>")


def test_a_command_subject_nobody_serves_is_refused_by_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-9: a new command subject without its row in the table stops the generator, naming it."""

    @dataclasses.dataclass(frozen=True)
    class WithNewCommand(Subjects):
        def command_subjects(self) -> dict[str, str]:
            return {**super().command_subjects(), "archive": f"{self.namespace}novelbus.cmd.archive"}

    with pytest.raises(ValueError, match="archive.*SERVES"):
        grants(WithNewCommand())
    monkeypatch.setitem(permissions.SERVES, "archive", "nobody")
    monkeypatch.setitem(permissions.SENDS, "archive", ("operator",))
    with pytest.raises(ValueError, match="unknown user.*nobody"):
        grants(WithNewCommand())


def test_every_deployment_file_provides_each_users_password() -> None:
    """OPS-9: a user the generator adds gets its password variable in the example environments
    and the compose files, and local.sh generates one for it (else nats-server refuses to start)."""
    users = grants()
    for name in ("example.env", "compose.yaml", "three-host/example.env", "three-host/compose.yaml"):
        text = (REPO / "deploy" / name).read_text(encoding="utf-8")
        assert [g.user for g in users if g.password_variable not in text] == [], name
    loop = next(line for line in (REPO / "deploy" / "local.sh").read_text(encoding="utf-8").splitlines()
                if line.startswith("for user in "))
    assert set(loop.removeprefix("for user in ").split(";")[0].split()) == {g.user.upper() for g in users}
