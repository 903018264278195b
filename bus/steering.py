"""The one client of `novelbus.cmd.steer` (PLAN-1..5): the CLI uses it, and so can a panel.

Every method sends one typed request and returns the typed reply; an error reply raises
`RemoteError` with its stable code (`revision-conflict`, `unit-in-flight`, `config-invalid`, …),
nobody serving the subject raises `BusUnavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nats.aio.client import Client as NATS

from novelbus.bus.client import request
from novelbus.messages import steer as m
from novelbus.messages.subjects import Subjects
from novelbus.novel.requirements import RequirementUpdate


class SteeringClient:
    def __init__(self, nc: NATS, subjects: Subjects, *, timeout: float = 15.0) -> None:
        self.nc = nc
        self.subject = subjects.steer
        self.timeout = timeout

    async def outline(self, novel_id: str) -> m.OutlineState:
        return await request(self.nc, self.subject, m.GetOutline(novel_id=novel_id), m.OutlineState,
                             timeout=self.timeout)

    async def revise(self, novel_id: str, layers: Mapping[str, Any], *, expected_revision: str | None,
                     reason: str, requirements: Sequence[RequirementUpdate] = (),
                     hold_ms: int = 10_000) -> m.RevisionApplied:
        msg = m.ReviseOutline(novel_id=novel_id, expected_revision=expected_revision, reason=reason,
                              layers=dict(layers), requirements=list(requirements), hold_ms=hold_ms)
        # the reply may wait for a claim to settle: give it the hold on top of the usual timeout
        return await request(self.nc, self.subject, msg, m.RevisionApplied, timeout=self.timeout + hold_ms / 1000)

    async def revisions(self, novel_id: str) -> m.Revisions:
        return await request(self.nc, self.subject, m.ListRevisions(novel_id=novel_id), m.Revisions,
                             timeout=self.timeout)

    async def config(self, novel_id: str, changes: Mapping[str, Any] | None = None) -> m.NovelConfigured:
        return await request(self.nc, self.subject, m.ConfigureNovel(novel_id=novel_id, set=dict(changes or {})),
                             m.NovelConfigured, timeout=self.timeout)

    async def direct(self, novel_id: str, text: str, message_id: str) -> m.DirectiveReceived:
        return await request(self.nc, self.subject, m.DirectNovel(novel_id=novel_id, text=text,
                                                                  message_id=message_id),
                             m.DirectiveReceived, timeout=self.timeout, retries=2)

    async def requirements(self, novel_id: str) -> m.RequirementsState:
        return await request(self.nc, self.subject, m.ListRequirements(novel_id=novel_id), m.RequirementsState,
                             timeout=self.timeout)

    async def planning(self, novel_id: str) -> m.PlanningView:
        """The planner's projection as of the latest commit (ROLE-4)."""
        return await request(self.nc, self.subject, m.GetPlanningView(novel_id=novel_id), m.PlanningView,
                             timeout=self.timeout)
