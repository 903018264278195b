"""Every subject and stream name in one place. A namespace prefix isolates deployments/tests."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAFE = re.compile(r"[^A-Za-z0-9_-]")

# The six actors (ARCH-1), in start order; their names key their subjects, NATS users and processes.
ACTOR_NAMES = ("claims", "packer", "writer", "verifier", "usage", "driver")


@dataclass(frozen=True)
class Subjects:
    namespace: str = ""  # "" in production; e.g. "t3fa9." in tests

    # --- commands: request/reply, served by queue groups (BUS-2) ---
    @property
    def claims(self) -> str:
        return f"{self.namespace}novelbus.cmd.claims"

    def commit(self, instance: str) -> str:
        # CLM-5: a commit goes to the claim-manager instance that holds the delegation.
        return f"{self.namespace}novelbus.cmd.commit.{instance}"

    @property
    def commit_all(self) -> str:
        return f"{self.namespace}novelbus.cmd.commit.*"

    @property
    def packs(self) -> str:
        return f"{self.namespace}novelbus.cmd.packs"

    @property
    def runs(self) -> str:
        return f"{self.namespace}novelbus.cmd.runs"

    @property
    def verify(self) -> str:
        return f"{self.namespace}novelbus.cmd.verify"

    @property
    def usage(self) -> str:
        return f"{self.namespace}novelbus.cmd.usage"

    @property
    def steer(self) -> str:
        # PLAN-1..5: outline revisions, config, directives; served by the driver
        return f"{self.namespace}novelbus.cmd.steer"

    def command_subjects(self) -> dict[str, str]:
        return {"claims": self.claims, "commit": self.commit("*"), "packs": self.packs,
                "runs": self.runs, "verify": self.verify, "usage": self.usage, "steer": self.steer}

    # --- durable work and events: JetStream (BUS-2, BUS-3) ---
    def work(self, novel_id: str) -> str:
        return f"{self.namespace}novel.work.{novel_id}"

    @property
    def work_all(self) -> str:
        return f"{self.namespace}novel.work.>"

    def event(self, novel_id: str, event_type: str) -> str:
        return f"{self.namespace}novel.events.{novel_id}.{event_type}"

    def events_of(self, novel_id: str | None = None) -> str:
        return f"{self.namespace}novel.events.{novel_id or '*'}.>"

    @property
    def events_all(self) -> str:
        return f"{self.namespace}novel.events.>"

    def dead_letter(self, kind: str) -> str:
        return f"{self.namespace}novelbus.dlq.{kind}"

    @property
    def dead_letter_all(self) -> str:
        return f"{self.namespace}novelbus.dlq.>"

    # --- stream / consumer names (no dots allowed) ---
    def _stream(self, name: str) -> str:
        prefix = _SAFE.sub("_", self.namespace.rstrip(".")).upper()
        return f"{prefix}_{name}" if prefix else name

    @property
    def work_stream(self) -> str:
        return self._stream("NOVELBUS_WORK")

    @property
    def events_stream(self) -> str:
        return self._stream("NOVELBUS_EVENTS")

    @property
    def dlq_stream(self) -> str:
        return self._stream("NOVELBUS_DLQ")
