"""Where a re-assembled context differs from the freeze it should reproduce (CTX-12).

Pure: compares a freeze's persisted manifest (JSON builtins) with the manifest of the context
assembled again from the store, and names the first source that differs and why — ids, versions
and sizes only (a manifest never carries prose, CTX-5).
"""

from __future__ import annotations

from typing import Any

_SOURCE_KEYS = ("layer", "kind", "sourceId", "sourceVersion", "sourceOffset")


def source_name(entry: dict[str, Any]) -> str:
    """``L2 canon commit-5#1``: a manifest entry's layer, kind and pointer."""
    sid = f"{entry.get('sourceId')}"
    if entry.get("sourceOffset"):
        sid += f"#{entry.get('sourceOffset')}"
    return f"{entry.get('layer')} {entry.get('kind')} {sid}"


def _first_in(kind: str, old: list[dict[str, Any]], new: list[dict[str, Any]],
              fields: tuple[str, ...]) -> tuple[str, str] | None:
    for a, b in zip(old, new, strict=False):
        if any(a.get(k) != b.get(k) for k in _SOURCE_KEYS):
            return source_name(a), f"the freeze {kind} {source_name(a)}, the store now gives {source_name(b)}"
        for k in fields:
            if a.get(k) != b.get(k):
                if k == "digest":
                    return source_name(a), f"its content differs from what the freeze read ({kind})"
                return source_name(a), f"{kind} {k} {a.get(k)!r} at the freeze, {b.get(k)!r} now"
    if len(old) > len(new):
        return source_name(old[len(new)]), f"the freeze {kind} it; the store now gives no such entry"
    if len(new) > len(old):
        return source_name(new[len(old)]), f"the store now gives it; the freeze did not have it ({kind})"
    return None


def first_difference(recorded: dict[str, Any], again: dict[str, Any]) -> tuple[str, str]:
    """(source, why) for a freeze whose context hash was not reproduced: the first manifest
    source (then omission, trim, layer) that differs between ``recorded`` and ``again``."""
    if recorded.get("watermark") is None:
        note = "the freeze recorded no extraction watermark, so it was assembled again as the store is now; "
    else:
        note = ""
    for kind, key, fields in (
        ("included", "sources", ("digest", "chars", "score", "verified")),
        ("omitted", "omitted", ("digest", "reason", "count", "score")),
    ):
        hit = _first_in(kind, list(recorded.get(key) or []), list(again.get(key) or []), fields)
        if hit is not None:
            return hit[0], note + hit[1]
    for a, b in zip(recorded.get("trims") or [], again.get("trims") or [], strict=False):
        if a != b:
            return (f"{a.get('layer')} {a.get('kind')} {a.get('sourceId')}",
                    note + f"trimmed to {a.get('keptChars')} of {a.get('totalChars')} chars at the freeze, "
                    f"{b.get('keptChars')} of {b.get('totalChars')} now")
    old_layers, new_layers = recorded.get("layers") or {}, again.get("layers") or {}
    for layer in sorted(new_layers):
        if old_layers and old_layers.get(layer) != new_layers[layer]:
            shown = [source_name(s) for s in recorded.get("sources") or [] if s.get("layer") == layer]
            return (layer if not shown else f"{layer} ({', '.join(shown[:4])}{' …' if len(shown) > 4 else ''})",
                    note + "the same sources give other content: a source row was changed in place")
    if not old_layers:
        return "context", note + "the freeze has no layer digests; its sources are the same, their content is not"
    return "request", note + "the layers are the same; the request or outline revision differ"
