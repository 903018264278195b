"""STUDY-2 / STUDY-8: what each variable under test may change, field by field.

Two tables. `VARIABLES` says, per variable a study may test, which config paths the arms may
differ in (checked at `study create`) and which fields of a writer's frozen context may differ
per sampled scene (checked before a pair is offered for review). `FIELDS` says how each field
is read from what one arm's writer was given for a scene (its freeze manifest, the arm's config
and the writer model of its runs). A new variable, or a new field of the manifest, is one entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variable:
    config: tuple[str, ...]  # dotted config paths (and everything under them) the arms may differ in
    manifest: frozenset[str] = frozenset()  # FIELDS that may differ per scene


VARIABLES: dict[str, Variable] = {
    # The writer mode decides who writes (one session, or bounded writers of a shape); the pack
    # each writer is given is built the same way for both.
    "writerMode": Variable(("writerMode", "writerShape")),
    "writerShape": Variable(("writerShape",)),
    # CTX-13: no references against the same frozen licensed cards: only the L3 layer differs.
    "references": Variable(("references",), frozenset({"references"})),
    "sampling": Variable(("model.sampling",), frozenset({"sampling"})),
    "continuityProfile": Variable(("continuityProfile",), frozenset({"profile", "budget"})),
    "canonSource": Variable(("canonSource", "extractor")),
    "detector": Variable(("detector",)),
}


@dataclass(frozen=True)
class ArmScene:
    """What one arm's writer was given for one scene: the freeze manifest of each of the scene's
    units (first unit first), the arm's novel config and the writer models of its runs."""

    manifests: Sequence[Mapping[str, Any]]
    config: Mapping[str, Any]
    models: tuple[str, ...] = ()
    units: tuple[str, ...] = field(default=())


def _sources(layer: str, kind: str | None = None) -> Callable[[ArmScene], Any]:
    def read(arm: ArmScene) -> Any:
        first = arm.manifests[0]
        return sorted((s.get("kind"), s.get("sourceId"), s.get("sourceVersion")) for s in first.get("sources", ())
                      if s.get("layer") == layer and (kind is None or s.get("kind") == kind))
    return read


def _references(arm: ArmScene) -> Any:
    first = arm.manifests[0]
    return (_sources("L3")(arm),
            sorted((o.get("kind"), o.get("sourceId"), o.get("reason")) for o in first.get("omitted", ())
                   if o.get("layer") == "L3"))


def _model(arm: ArmScene) -> Any:
    model = {k: v for k, v in (arm.config.get("model") or {}).items() if k != "sampling"}
    return sorted(set(arm.models)), model


# STUDY-2: the fields compared per sampled scene, and how each is read.
FIELDS: dict[str, Callable[[ArmScene], Any]] = {
    "outlineRevision": lambda arm: arm.manifests[0].get("outlineRevision"),
    "style": _sources("L0", "story"),  # the story block (premise, style) of that outline revision
    "chapterBlock": _sources("L0", "chapter"),
    "sceneBlock": _sources("L0", "scene"),
    "foreshadowingDue": _sources("L0", "foreshadowing-due"),
    "profile": lambda arm: {k: v for k, v in (arm.manifests[0].get("request") or {}).items()
                            if k in ("profile", "purpose", "scenario")},
    "budget": lambda arm: arm.manifests[0].get("budget"),
    "length": lambda arm: arm.config.get("length"),
    "model": _model,
    "sampling": lambda arm: (arm.config.get("model") or {}).get("sampling"),
    "references": _references,
}


def check_scene(variable: str, test: ArmScene, base: ArmScene) -> list[str]:
    """The fields in which what the two arms' writers were given for one scene differ although
    the variable under test does not change them (empty: the pair may be reviewed). A scene an
    arm has no frozen manifest for fails on `manifest`."""
    if not test.manifests or not base.manifests:
        return ["manifest"]
    allowed = VARIABLES[variable].manifest
    return [name for name, read in FIELDS.items() if name not in allowed and read(test) != read(base)]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The dotted config paths in which two configs differ, sorted."""
    fa, fb = _flatten(a), _flatten(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k, ...) != fb.get(k, ...))


def refused_differences(variable: str, paths: Sequence[str]) -> list[str]:
    """The paths a study of `variable` may not have its arms differ in."""
    allowed = VARIABLES[variable].config
    return [p for p in paths if not any(p == a or p.startswith(a + ".") for a in allowed)]
