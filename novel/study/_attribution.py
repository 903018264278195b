"""STUDY-5: a flagged problem traced to what its writer was given.

For a flag (a ConStory category and a span of one text), `attribute` reads the freeze manifests
of the units that wrote that text: the blocks present, and for each pack field that carries the
flag's kind of information, the sources included and those omitted or trimmed with their reason.
`group_by_field` gathers the flags under the pack field that carried, or should have carried,
the information: a flag whose field was in the pack points at the writer, one whose field was
missing or trimmed points at the pack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The pack fields by (layer, kind) of the manifest's sources.
PACK_FIELDS: dict[str, tuple[str, str | None]] = {
    "characters": ("L2", "character"),
    "canon": ("L2", "canon"),
    "lore": ("L2", "lore"),
    "foreshadowing": ("L2", "foreshadowing"),
    "story": ("L0", "story"),
    "chapter": ("L0", "chapter"),
    "scene": ("L0", "scene"),
    "prose": ("L1", None),
    "references": ("L3", None),
}

# Which pack fields carry the information a category of problem is about; the first one is the
# field the flag is grouped under.
CATEGORY_FIELDS: dict[str, tuple[str, ...]] = {
    "characterization": ("characters", "canon"),
    "factual-detail": ("canon", "lore", "prose"),
    "narrative-style": ("story", "references"),
    "timeline-plot": ("scene", "chapter", "prose", "foreshadowing"),
    "world-building": ("lore", "story"),
}


def _matches(entry: Mapping[str, Any], layer: str, kind: str | None) -> bool:
    return entry.get("layer") == layer and (kind is None or entry.get("kind") == kind)


def attribute(category: str, manifests: Sequence[Mapping[str, Any]], participants: Sequence[str] = ()) -> dict[str, Any]:
    """What the writer of the flagged text was given for the fields `category` is about."""
    fields: dict[str, Any] = {}
    blocks = sorted({f"{s.get('layer')}:{s.get('kind')}" for m in manifests for s in m.get("sources", ())})
    for name in CATEGORY_FIELDS[category]:
        layer, kind = PACK_FIELDS[name]
        included = sorted({str(s.get("sourceId")) for m in manifests for s in m.get("sources", ())
                           if _matches(s, layer, kind)})
        omitted = sorted({(str(o.get("sourceId")), str(o.get("reason"))) for m in manifests
                          for o in m.get("omitted", ()) if _matches(o, layer, kind)})
        trimmed = sorted({(str(t.get("sourceId")), str(t.get("reason"))) for m in manifests
                          for t in m.get("trims", ()) if _matches(t, layer, kind)})
        fields[name] = {"included": included,
                        "omitted": [{"sourceId": s, "reason": r} for s, r in omitted],
                        "trimmed": [{"sourceId": s, "reason": r} for s, r in trimmed]}
    out: dict[str, Any] = {"category": category, "field": CATEGORY_FIELDS[category][0], "blocks": blocks,
                           "fields": fields, "manifests": len(manifests)}
    if category == "characterization":  # was each participant's canon state in the pack?
        cards = set(fields["characters"]["included"])
        out["participants"] = {p: p in cards for p in participants}
    out["inPack"] = bool(manifests) and bool(fields[out["field"]]["included"])
    return out


def group_by_field(flags: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Flags (each with its `attribution`) under the pack field that carried, or should have
    carried, the information."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for flag in flags:
        groups.setdefault(str(flag["attribution"]["field"]), []).append(dict(flag))
    return dict(sorted(groups.items()))
