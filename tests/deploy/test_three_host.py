"""OPS-12: the deploy examples are checked without a container engine — the compose files against
the Compose Specification's JSON schema (vendored beside this file, Apache-2.0), the three-host
example for what it must hold, and its NATS node configurations by `nats-server -t`."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from novelbus.infra.nats import nats_server_binary
from novelbus.messages.subjects import ACTOR_NAMES

REPO = Path(__file__).resolve().parents[2]
THREE_HOST = REPO / "deploy" / "three-host"
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
MODEL_CALLERS = ("writer", "driver", "verifier", "panel", "cli")  # writer, planner+extractor, detector, create
NATS_USERS = ("DRIVER", "CLAIMS", "PACKER", "WRITER", "VERIFIER", "USAGE", "OPERATOR", "SCHEDULER", "MONITOR")


def _compose(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())  # YAML merge keys (`<<`) resolved, as compose does
    assert isinstance(loaded, dict), path
    return loaded


def _errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("path", [REPO / "deploy" / "compose.yaml", THREE_HOST / "compose.yaml"],
                         ids=["single-host", "three-host"])
def test_compose_files_follow_the_compose_specification_schema(path: Path) -> None:
    """OPS-12: each compose file validates against the Compose Specification's schema, and the same
    schema refuses the file with a misspelt service key (the check can fail)."""
    doc = _compose(path)
    assert _errors(doc) == []
    broken = copy.deepcopy(doc)
    service = next(iter(broken["services"].values()))
    service["restarts"] = service.pop("restart", "always")
    assert any("restarts" in e for e in _errors(broken)), "the schema let an unknown service key through"


def test_three_host_example_has_the_cluster_replicas_claim_managers_panel_and_model_urls() -> None:
    """OPS-12, REL-10, CLM-5: three NATS nodes (one per host profile), every actor with stream
    replicas 3 and its own NATS user, two claim managers with distinct instances, the panel behind a
    token, and the model's URL for every service that calls the model."""
    services = _compose(THREE_HOST / "compose.yaml")["services"]
    profiles = {name: tuple(s.get("profiles", ())) for name, s in services.items()}
    assert {n for n, p in profiles.items() if n.startswith("nats-")} == {"nats-a", "nats-b", "nats-c"}
    assert {profiles[f"nats-{h}"] for h in "abc"} == {("host-a",), ("host-b",), ("host-c",)}
    commands = {name: s["command"] for name, s in services.items()}
    actors = {c[1] for c in commands.values() if c[0] == "actor"}
    assert actors == set(ACTOR_NAMES), actors
    claims = [c[c.index("--instance") + 1] for c in commands.values() if c[:2] == ["actor", "claims"]]
    assert sorted(claims) == ["claims-0", "claims-1"]
    assert commands["panel"][0] == "panel" and "NOVELBUS_PANEL_TOKEN" in services["panel"]["environment"]
    for name, s in services.items():
        if name.startswith("nats-"):
            continue
        env = s["environment"]
        assert env["NOVELBUS_STREAM_REPLICAS"] == "3", name
        user = env["NOVELBUS_NATS_URL"].removeprefix("nats://").split(":")[0]
        expected = commands[name][1] if commands[name][0] == "actor" else "operator"
        assert user == expected, (name, user)
        calls_model = "NOVELBUS_MODEL_BASE_URL" in env and "NOVELBUS_MODEL" in env
        assert calls_model == (name in MODEL_CALLERS), name
    route_urls = services["nats-a"]["environment"]
    for h in "ABC":
        assert route_urls[f"NOVELBUS_NATS_ROUTE_{h}"].startswith("nats-route://route:${NOVELBUS_NATS_ROUTE_PASSWORD}@")


def _env() -> dict[str, str]:
    env = {f"NOVELBUS_NATS_{u}_PASSWORD": "test-only" for u in NATS_USERS}
    env["NOVELBUS_NATS_ROUTE_PASSWORD"] = "test-only-route"
    for h in "ABC":
        env[f"NOVELBUS_NATS_ROUTE_{h}"] = f"nats-route://route:test-only-route@nats-{h.lower()}.novelbus.internal:6222"
    return env


def _check(conf: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(nats_server_binary()), "-c", conf.name, "-t"], cwd=conf.parent, env=env,
                          capture_output=True, text=True, timeout=30)


def test_three_host_nats_configs_pass_nats_server_t_and_require_route_credentials() -> None:
    """OPS-12: nats-{a,b,c}.conf (with ../nats.conf's users) pass `nats-server -t`; each node's
    cluster block requires the route user's password, and without it the configuration is refused."""
    confs = sorted(THREE_HOST.glob("nats-*.conf"))
    assert [c.name for c in confs] == ["nats-a.conf", "nats-b.conf", "nats-c.conf"]
    for conf in confs:
        out = _check(conf, _env())
        assert out.returncode == 0 and "is valid" in out.stdout + out.stderr, out
        text = conf.read_text()
        assert "authorization" in text.split("cluster {", 1)[1], conf
        missing = {k: v for k, v in _env().items() if k != "NOVELBUS_NATS_ROUTE_PASSWORD"}
        refused = _check(conf, missing)
        assert refused.returncode != 0 and "NOVELBUS_NATS_ROUTE_PASSWORD" in refused.stdout + refused.stderr, refused
