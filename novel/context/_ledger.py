"""The manifest ledger: CTX-5 ordering, selection under a cap, omissions and trims recorded."""

from __future__ import annotations

import hashlib
import heapq
from typing import Any

import msgspec

from novelbus.novel.context._structs import ManifestOmission, ManifestSource, ManifestTrim


def order_key(score: int, version: int, source_id: str, offset: int) -> tuple[int, int, str, int]:
    """CTX-5: ``score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC``."""
    return (-score, version, source_id, offset)


class Candidate(msgspec.Struct):
    kind: str
    layer: str
    score: int
    version: int
    source_id: str
    offset: int
    chars: int
    payload: Any = None
    verified: bool = True
    digest: str = ""  # CTX-12: of the source's content as read (prose, facts), when it has content

    def key(self) -> tuple[int, int, str, int]:
        return order_key(self.score, self.version, self.source_id, self.offset)


OMISSIONS_LISTED = 8  # per (layer, kind, reason); the rest is one counted entry


class Ledger:
    """Collects manifest entries while the layers are built.

    Omissions are listed one by one up to OMISSIONS_LISTED per (layer, kind, reason), in
    CTX-5 order; further ones are folded into one entry with a count, so the manifest stays
    bounded however long the book grows.
    """

    def __init__(self) -> None:
        self.sources: list[ManifestSource] = []
        self.omitted: list[ManifestOmission] = []
        self.trims: list[ManifestTrim] = []
        self._listed: dict[tuple[str, str, str], int] = {}
        self._folded: dict[tuple[str, str, str], int] = {}

    def take(self, c: Candidate, chars: int | None = None) -> None:
        self.sources.append(
            ManifestSource(
                layer=c.layer,
                kind=c.kind,
                source_id=c.source_id,
                source_version=c.version,
                source_offset=c.offset,
                score=c.score,
                chars=c.chars if chars is None else chars,
                verified=c.verified,
                digest=c.digest,
            )
        )

    def omit(self, c: Candidate, reason: str, count: int = 1) -> None:
        """Record an omitted candidate (``count`` > 1: it stands for that many, all ranked
        at or below it)."""
        key = (c.layer, c.kind, reason)
        listed = self._listed.get(key, 0)
        if listed < OMISSIONS_LISTED and count == 1:
            self._listed[key] = listed + 1
            self.omitted.append(self._entry(c, reason, 1, c.digest))
            return
        folded = self._folded.get(key)
        if folded is None:
            self._folded[key] = len(self.omitted)
            self.omitted.append(self._entry(c, reason, count, ""))  # folded: stands for many
        else:
            entry = self.omitted[folded]
            self.omitted[folded] = msgspec.structs.replace(entry, count=entry.count + count)

    @staticmethod
    def _entry(c: Candidate, reason: str, count: int, digest: str) -> ManifestOmission:
        return ManifestOmission(
            layer=c.layer,
            kind=c.kind,
            source_id=c.source_id,
            source_version=c.version,
            source_offset=c.offset,
            score=c.score,
            reason=reason,
            count=count,
            digest=digest,
        )

    def trim(self, layer: str, kind: str, source_id: str, kept: int, total: int, why: str) -> None:
        self.trims.append(ManifestTrim(layer, kind, source_id, kept, total, why))


def content_digest(text: str) -> str:
    """CTX-12: a short SHA-256 of one source's content, so a verification names the source whose
    row changed (the context hash is the proof; this only points)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def select_ranked(
    candidates: list[Candidate], cap: int, ledger: Ledger, reason: str
) -> list[Candidate]:
    """Order by CTX-5, keep the first ``cap``, record the rest as omitted (as `Ledger.omit` of
    each in order would: SERVE-8, past the ones it can list, the rest is one count, so a book's
    growing number of candidates costs no call each)."""
    head = heapq.nsmallest(cap + OMISSIONS_LISTED + 1, candidates, key=Candidate.key)  # = sorted(...)[:n]
    for c in head[cap:]:
        ledger.omit(c, reason)
    if len(candidates) > len(head):  # at most OMISSIONS_LISTED are listed: the last of head was folded
        ledger.omit(head[-1], reason, count=len(candidates) - len(head))
    kept = head[:cap]
    for c in kept:
        ledger.take(c)
    return kept
