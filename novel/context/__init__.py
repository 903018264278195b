"""Trusted context assembly (SPEC §8, CTX-1..7, CTX-9): a PURE assembler.

The writer pack is never rendered from an ad hoc read. It is the writer's projection (CTX-8,
``novel.pack``) of a frozen, hashed context built here in four steps:

1. ``validate_request`` — novelId, unit, asOf (the last commit seq visible to the unit),
   scenario (``generation | extraction | planning | detection``), purpose (``production |
   evaluation | diagnostic``) and continuity profile (``bounded | wide``). Unknown values are
   rejected with ``ContextInputError``, never defaulted (CTX-1).
2. ``plan_retrieval`` — the ``RetrievalPlan`` is fixed from the outline and the unit's identity
   before any source is read and before any model call: queries (participants, lore keywords,
   canon kinds, baseline chapters, pointer recall), filters (``seq <= asOf``, superseded units
   out, disabled lore out), index versions, budget and order (CTX-2).
3. read-back by pointer — ``resolve_pointers`` names the commits whose prose the plan needs;
   ``store.context.read_context_sources`` reads the index and exactly those bodies inside ONE
   ``REPEATABLE READ READ ONLY`` transaction; ``sources_from_snapshot`` does the same over an
   in-memory snapshot (pure tests, benchmarks) (CTX-4).
4. ``assemble_context`` — proves every source is at or before asOf (fail closed,
   ``ContextLeakError``), builds the four layers, orders every candidate list
   ``score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC``, applies the profile budget
   recording each trim and omission, fails loud when L0 or the continuity baseline do not fit
   (``ContextBudgetError``), and returns the context with its retrieval manifest and the
   SHA-256 of both (CTX-5, CTX-7).

Layers (CTX-7): L0 current task (story, chapter, scene, unit, narrative state, length contract —
never trimmed); L1 prose (continuity baseline, then pointer-recalled prose, trimmed stably); L2
work facts (character and lore cards from the outline, canon cards from commits with pointers
to the prose that established them, foreshadowing state — participants only, never future
state); L3 licensed references (``_references``, CTX-13: only for the scenarios that ask and
the purposes their authorisation covers at the freeze date; never for extraction or detection).

CTX-11 (``_watermark``, ADR 0007): the store records in the manifest the extraction state its read
saw, and a read given that watermark sees exactly it again, so a freeze can be re-assembled.

Cards are an index (CTX-3): a canon card carries the commit that established it and its source
pointers (``commit-7#2``); a card whose pointers do not resolve to prose at or before asOf is
kept only as an unverified hint and never recalls prose.

The caller persists the freeze (CTX-6: ``store.save_context_freeze``) — this module never
touches a database. Scores per candidate kind (all integers, higher first):

- characters, foreshadowing: declaration rank (PACK-3 order: earlier declared first);
- lore: ``1000 × key hits + content keyword hits``;
- canon facts: recency ``1000 × commit seq + fact index`` (the latest state wins);
- recalled prose: ``2 × participants named by the pointing facts + 1`` when a pointer names the
  paragraph exactly;
- baseline prose: 0 (it is never ranked: chronological by sourceVersion).

One job per module: ``_errors``, ``_request`` (request, budgets, plan), ``_sources``,
``_structs``, ``_hashing``, ``_ledger``, ``_select`` (per-kind selectors), ``_assemble``; this
``__init__`` re-exports the public names.
"""

from __future__ import annotations

from novelbus.novel.context._assemble import (
    assemble_context,
    continuation_context,
    freeze_from_snapshot,
    length_contract,
    manifest_summary,
)
from novelbus.novel.context._errors import (
    ContextBudgetError,
    ContextError,
    ContextInputError,
    ContextLeakError,
    WriterPackError,
)
from novelbus.novel.context._hashing import IdentityCache, canonical_json, sha256_of
from novelbus.novel.context._ledger import OMISSIONS_LISTED, order_key
from novelbus.novel.context._references import (
    MAX_REFERENCES,
    REFERENCE_CHARS,
    REFERENCE_SCENARIOS,
    authorised_purpose,
    refusal,
    select_references,
)
from novelbus.novel.context._request import (
    BUDGETS,
    CANON_KINDS,
    CONTEXT_SCHEMA,
    HEADER_RE,
    LORE_CONTENT_MIN_HITS,
    MANIFEST_SCHEMA,
    MAX_CANON_FACTS,
    MAX_CHARACTERS,
    MAX_FORESHADOWING,
    MAX_LORE_ENTRIES,
    ORDER,
    PROFILES,
    PROSE_TAIL_LIMIT,
    PURPOSES,
    SCENARIOS,
    ContextRequest,
    ProfileBudget,
    RetrievalPlan,
    find_unit,
    keyword_set,
    plan_retrieval,
    resolve_pointers,
    scene_keywords,
    validate_request,
)
from novelbus.novel.context._select import (
    escape_prose,
)
from novelbus.novel.context._sources import (
    ContextSources,
    Readback,
    check_as_of,
    default_as_of,
    prove_sources,
    sources_from_snapshot,
)
from novelbus.novel.context._structs import (
    NO_REFERENCES,
    CanonCard,
    FactsLayer,
    ForeshadowingCard,
    FrozenContext,
    LengthContract,
    ManifestOmission,
    ManifestSource,
    ManifestTrim,
    ProseExcerpt,
    ProseLayer,
    ReferenceCard,
    ReferenceLayer,
    RetrievalManifest,
    TaskLayer,
    WriterContext,
)
from novelbus.novel.context._verify import first_difference, source_name
from novelbus.novel.context._watermark import (
    Watermark,
    WatermarkError,
    facts_as_of,
    in_ranges,
    seq_ranges,
    units_as_of,
    watermark_of,
)

__all__ = [
    "OMISSIONS_LISTED",
    "BUDGETS",
    "CANON_KINDS",
    "CONTEXT_SCHEMA",
    "CanonCard",
    "ContextBudgetError",
    "ContextError",
    "ContextInputError",
    "ContextLeakError",
    "ContextRequest",
    "ContextSources",
    "FactsLayer",
    "ForeshadowingCard",
    "FrozenContext",
    "HEADER_RE",
    "IdentityCache",
    "LORE_CONTENT_MIN_HITS",
    "LengthContract",
    "MANIFEST_SCHEMA",
    "MAX_CANON_FACTS",
    "MAX_CHARACTERS",
    "MAX_FORESHADOWING",
    "MAX_LORE_ENTRIES",
    "ManifestOmission",
    "ManifestSource",
    "ManifestTrim",
    "ORDER",
    "PROFILES",
    "PROSE_TAIL_LIMIT",
    "PURPOSES",
    "ProfileBudget",
    "ProseExcerpt",
    "ProseLayer",
    "Readback",
    "MAX_REFERENCES",
    "NO_REFERENCES",
    "REFERENCE_CHARS",
    "REFERENCE_SCENARIOS",
    "ReferenceCard",
    "ReferenceLayer",
    "authorised_purpose",
    "refusal",
    "select_references",
    "RetrievalManifest",
    "RetrievalPlan",
    "SCENARIOS",
    "TaskLayer",
    "WriterContext",
    "Watermark",
    "WatermarkError",
    "WriterPackError",
    "facts_as_of",
    "first_difference",
    "source_name",
    "in_ranges",
    "seq_ranges",
    "units_as_of",
    "watermark_of",
    "assemble_context",
    "canonical_json",
    "check_as_of",
    "continuation_context",
    "default_as_of",
    "escape_prose",
    "find_unit",
    "freeze_from_snapshot",
    "keyword_set",
    "length_contract",
    "manifest_summary",
    "order_key",
    "plan_retrieval",
    "prove_sources",
    "resolve_pointers",
    "scene_keywords",
    "sha256_of",
    "sources_from_snapshot",
    "validate_request",
]
