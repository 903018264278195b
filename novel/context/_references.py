"""L3: which licensed references a context may carry (CTX-7, CTX-13).

A reference enters a context only when the request's scenario asks for its kind
(`REFERENCE_SCENARIOS`: the writer's `generation` asks for every kind; extraction, detection and
planning ask for none, so a reference can never reach the extractor, the detector or the planner,
nor become a canon fact) and its authorisation snapshot covers the request at the freeze point:
a licence (not one of `UNLICENSED`), the request's purpose among its purposes, and — when it has
an expiry — a freeze date before that day. Otherwise it is left out with the reason in the
manifest. The freeze date is the store's (`ContextSources.references_on`, recorded in the
watermark, CTX-11): pure code has no clock. A `diagnostic` request (`novelbus pack`) shows what
the writer gets, so it is authorised as `production`.

Included references are ordered as declared (CTX-5: score = declaration rank), at most
`MAX_REFERENCES`, each at most `REFERENCE_CHARS` characters in the context.
"""

from __future__ import annotations

from novelbus.novel.context._ledger import Candidate, Ledger, content_digest
from novelbus.novel.context._request import ContextRequest
from novelbus.novel.context._structs import ReferenceCard
from novelbus.novel.outline import UNLICENSED, Reference
from novelbus.novel.text import truncate

REFERENCE_SCENARIOS: dict[str, tuple[str, ...]] = {"generation": ("style", "pattern", "excerpt")}
MAX_REFERENCES = 4
REFERENCE_CHARS = 1_200


def authorised_purpose(purpose: str) -> str:
    """The purpose a reference must cover for a request of ``purpose``."""
    return "production" if purpose == "diagnostic" else purpose


def refusal(reference: Reference, request: ContextRequest, on: str | None) -> str | None:
    """Why ``reference`` may not enter the context of ``request`` frozen on day ``on`` (ISO date;
    None: unknown), or None when it may (CTX-13; fail closed)."""
    kinds = REFERENCE_SCENARIOS.get(request.scenario, ())
    if reference.kind not in kinds:
        return f"not-requested:{request.scenario}"
    if reference.licence.strip().lower() in UNLICENSED:
        return "unlicensed"
    purpose = authorised_purpose(request.purpose)
    if purpose not in reference.purposes:
        return f"purpose-not-covered:{purpose}"
    if reference.expires is not None:
        if on is None:
            return "expiry-unverifiable"
        if on >= reference.expires:
            return f"expired:{reference.expires}"
    return None


def select_references(
    references: list[Reference], request: ContextRequest, on: str | None, ledger: Ledger | None = None
) -> list[ReferenceCard]:
    """The references the context carries, every other one recorded as omitted with its reason
    (``ledger`` None: nobody keeps the record, e.g. the W2 read tool)."""
    ledger = ledger or Ledger()
    n = len(references)
    kept: list[ReferenceCard] = []
    for i, ref in enumerate(references):
        text = truncate(ref.text, REFERENCE_CHARS)
        cand = Candidate(f"reference-{ref.kind}", "L3", n - i, 0, ref.referenceId, 0, len(text),
                         digest=content_digest(f"{ref.text}\n{ref.source}\n{ref.licence}"))
        why = refusal(ref, request, on)
        if why is None and len(kept) >= MAX_REFERENCES:
            why = f"cap:{MAX_REFERENCES}"
        if why is not None:
            ledger.omit(cand, why)
            continue
        ledger.take(cand)
        if len(text) < len(ref.text):
            ledger.trim("L3", cand.kind, ref.referenceId, len(text), len(ref.text), "reference limit")
        kept.append(ReferenceCard(reference_id=ref.referenceId, kind=ref.kind, text=text, source=ref.source,
                                  licence=ref.licence))
    return kept
