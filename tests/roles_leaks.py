"""What a role projection must never carry (ROLE-1, CTX-8, the visibility table), as a scan
the tests of every role share: keys of the trusted boundary, id and hash shapes, arm names for the
judge, raw paths, and the store's own secrets passed in."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

# Keys (any case, any nesting) that belong to the trusted boundary, never to a model's input.
FORBIDDEN_KEYS = frozenset(k.lower() for k in (
    "runId", "claimId", "delegationId", "delegation", "token", "tokenHash", "executionToken", "permissions",
    "manifest", "manifestSha256", "contextSha256", "bodyHash", "sha256", "hash", "candidateVersion",
    "version", "attempt", "lastError", "pauseReason", "arm", "writerMode", "mode", "outlineRevision",
    "receipt", "rawPath", "oracle", "verdict", "judges",
))
# Value shapes: our run, claim and delegation ids; hex digests of 32+ characters; absolute paths.
ID_RE = re.compile(r"\b(?:run-[0-9a-f]{8,}|claim-[0-9a-f]{8,}|dlg-[\w-]+-[0-9a-f]{12,})\b")
DIGEST_RE = re.compile(r"\b[0-9a-f]{32,}\b")
PATH_RE = re.compile(r"(?:^|[\s\"'(])(?:/(?:home|tmp|work|var|usr|etc|root)/[\w./-]+|[A-Za-z]:\\\\[\w\\\\.-]+)")
# The blind judge never learns which arm wrote which text (JUDGE-2).
ARM_RE = re.compile(r"(?<![\w-])(?:inline|subagent|W1|W2)(?![\w-])")


def _walk(value: Any, path: str = "$") -> Iterator[tuple[str, str | None, Any]]:
    """(path, key or None, value) for every node."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{path}.{k}", str(k), v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield f"{path}[{i}]", None, v
            yield from _walk(v, f"{path}[{i}]")


def leaks(projection: Any, *, secrets: Iterable[str] = (), judge: bool = False) -> list[str]:
    """Everything forbidden found in a projection, as `path: what` lines (empty: clean)."""
    found: list[str] = []
    secrets = [s for s in secrets if s]
    for path, key, value in [("$", None, projection), *_walk(projection)]:
        if key is not None and key.lower() in FORBIDDEN_KEYS:
            found.append(f"{path}: forbidden key {key!r}")
        if not isinstance(value, str):
            continue
        for rx, what in ((ID_RE, "id"), (DIGEST_RE, "digest"), (PATH_RE, "path")):
            m = rx.search(value)
            if m is not None:
                found.append(f"{path}: {what} {m.group(0)!r}")
        if judge:
            m = ARM_RE.search(value)
            if m is not None:
                found.append(f"{path}: arm name {m.group(0)!r}")
        found += [f"{path}: the store's secret {s[:8]}…" for s in secrets if s in value]
    return found
