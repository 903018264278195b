"""Routing of delegation-scoped commands to the claim-manager instance that holds them (CLM-5).

A claim goes to any instance (queue group `novelbus.cmd.claims`); the delegation it creates lives
only in that instance's memory, so everything scoped to the delegation is routed by instance:
commits on `novelbus.cmd.commit.<instance>` (Subjects.commit), dispatch grants and releases on
`novelbus.cmd.claims.<instance>`. Delegation ids name their instance: `dlg-<instance>-<24 hex>`.
"""

from __future__ import annotations

import re

from novelbus.messages.subjects import Subjects

INSTANCE_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DELEGATION = re.compile(r"^dlg-([A-Za-z0-9_-]{1,64})-[0-9a-f]{24}$")


def check_instance(instance: str) -> str:
    """An instance id is one subject token: letters, digits, `_` and `-`, at most 64."""
    if not INSTANCE_PATTERN.match(instance or ""):
        raise ValueError(f"instance id {instance!r} is invalid: use 1-64 letters, digits, '_' or '-'")
    return instance


def claims_instance_subject(subjects: Subjects, instance: str) -> str:
    """Where dispatch grants and releases of a delegation held by `instance` go."""
    return f"{subjects.claims}.{check_instance(instance)}"


def delegation_instance(delegation_id: str) -> str | None:
    """The instance a delegation id names, or None for a malformed id."""
    match = _DELEGATION.match(delegation_id)
    return match.group(1) if match else None
