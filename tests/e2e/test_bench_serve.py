"""SERVE-7: `novelbus bench serve --json` against the REAL embedded llama-server, as a user runs it.

A short run (N = 1 and 2, one W1 unit per novel, two slots, affinity compared at N = 2) prints one
JSON object whose phases carry every figure the bench names, and whose targets carry each figure
beside its target; the figures are checked against each other, not against constants. Bad options
are refused before any server starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_local_model import _need_local_model

PHASE_FIELDS = {
    "novels", "affinity", "units", "seconds", "units_per_min", "output_tokens_per_s", "prompt_tokens",
    "prompt_tokens_cached", "prompt_tokens_processed", "cached_share", "server_busy_share",
    "orchestration_share", "unit_latency_p50_ms", "unit_latency_p99_ms", "units_per_novel_min",
    "units_per_novel_max",
}


def _bench(home: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NOVELBUS_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "novelbus.cli.main", "bench", "serve", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.mark.local_model
@pytest.mark.timeout(1500)
def test_bench_serve_json_prints_every_figure_and_each_target_beside_it(tmp_path: Path) -> None:
    """SERVE-7"""
    _need_local_model()
    done = _bench(tmp_path, "--novels", "1,2", "--units", "1", "--slots", "2", "--json", timeout=1400)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["slots"] == 2 and report["shape"] == "W1"
    phases = report["phases"]
    assert [(p["novels"], p["affinity"]) for p in phases] == [(1, True), (2, True), (2, False)]
    for p in phases:
        assert set(p) == PHASE_FIELDS
        assert p["units"] >= p["novels"] and p["units_per_min"] > 0 and p["output_tokens_per_s"] > 0
        assert 0 <= p["prompt_tokens_cached"] <= p["prompt_tokens"] and p["prompt_tokens"] > 0
        assert p["cached_share"] == round(p["prompt_tokens_cached"] / p["prompt_tokens"], 4)
        assert 0 < p["server_busy_share"] <= 1 and 0 <= p["orchestration_share"] < 1
        assert 0 < p["unit_latency_p50_ms"] <= p["unit_latency_p99_ms"]
        # at the first novel's finish, another may not have committed yet
        assert 0 <= p["units_per_novel_min"] <= p["units_per_novel_max"] and p["units_per_novel_max"] >= 1
    affinity = report["affinity"]
    assert affinity["novels"] == 2
    assert affinity["cached_share_added"] == round(affinity["on"]["cached_share"] - affinity["off"]["cached_share"], 4)
    targets = report["targets"]
    assert set(targets) == {"cached_share_affinity_on", "cached_share_on_minus_off", "units_per_min_on_minus_off",
                            "orchestration_share_max"}  # N = 4 did not run: no speed-up target
    for goal in targets.values():
        assert set(goal) == {"value", "target", "at_least", "ok"}
        held = goal["value"] >= goal["target"] if goal["at_least"] else goal["value"] <= goal["target"]
        assert goal["ok"] is held
    assert targets["orchestration_share_max"]["value"] == max(p["orchestration_share"] for p in phases)


@pytest.mark.parametrize(("args", "said"), [
    (["--novels", "1,x"], "--novels must be whole numbers"),
    (["--novels", "0"], "each at least 1"),
    (["--units", "0"], "--units must be at least 1"),
    (["--slots", "65"], "--slots must be from 1 to 64"),
])
def test_bench_serve_refuses_bad_options_naming_them(tmp_path: Path, args: list[str], said: str) -> None:
    """SERVE-7: refused with exit 2 before any server starts."""
    done = _bench(tmp_path, *args, timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not (tmp_path / "nats").exists()
