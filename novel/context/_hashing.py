"""Canonical JSON and SHA-256 of contexts and manifests, and the identity cache for outline objects (CTX-6)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import BaseModel


class IdentityCache:
    """Memoise ``fn(obj, *extra)`` for immutable objects (frozen outline models) by identity.

    Each entry keeps a strong reference to ``obj``, so an id cannot be reused by another object
    while its entry lives; the oldest entries are dropped beyond ``size``. Outline objects are
    shared by every render of a revision (store.context caches parsed outlines), so the stable
    parts of a context are dumped and rendered once.
    """

    def __init__(self, fn: Callable[..., Any], size: int = 4096) -> None:
        self.fn = fn
        self.size = size
        self.entries: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def __call__(self, obj: Any, *extra: Any) -> Any:
        key = (id(obj), *extra)
        hit = self.entries.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = self.fn(obj, *extra)
        if len(self.entries) >= self.size:
            self.entries.pop(next(iter(self.entries)))
        self.entries[key] = (obj, value)
        return value


_dump_model = IdentityCache(lambda model: model.model_dump(mode="json"))


json_size = IdentityCache(lambda model: len(model.model_dump_json()))


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return _dump_model(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook, order="deterministic")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON (sorted map keys, struct fields in declaration order)."""
    return _ENCODER.encode(obj)


def sha256_of(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()
