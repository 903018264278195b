"""What of a model's tool call may be recorded in events and run manifests (REL-9, RUN-6).

The model writes a tool call's arguments, so everything in them is model-authored text unless its
shape says otherwise. Recorded: ids (a property named `…Id`/`…Ids`/`id` whose value has the shape
of an id), commit sources (`inline`, `inline#2`, `commit-7#0`), enum values the tool registry
declares for that property, numbers, booleans and nulls. Every other string becomes
`{"chars": n, "sha256": hex}`: a monitor can tell two calls apart, or check a call against the
stored body, without ever reading the writer's sentences. Derived from the registry's parameter
schemas, never copied.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from typing import Any

from novelbus.writers.tools import TOOL_REGISTRY, tool_parameters_schema

ARGS_RECORD_CAP = 4000  # recorded JSON text at most this long (then a marker of what was left out)
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # SPEC §16 ids
SOURCE_PATTERN = re.compile(r"^(inline|commit-[0-9]{1,9})(#[0-9]{1,6})?$")
KEY_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


def digest(text: str) -> dict[str, Any]:
    """A string recorded by size and hash only."""
    return {"chars": len(text), "sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()}


def _walk_enums(schema: Any, defs: dict[str, Any], out: dict[str, set[str]], key: str | None) -> None:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            _walk_enums(defs.get(ref.rsplit("/", 1)[1], {}), defs, out, key)
        if key is not None and isinstance(schema.get("enum"), list):
            out.setdefault(key, set()).update(v for v in schema["enum"] if isinstance(v, str))
        if key is not None and isinstance(schema.get("const"), str):
            out.setdefault(key, set()).add(schema["const"])
        for name, sub in (schema.get("properties") or {}).items():
            _walk_enums(sub, defs, out, name)
        for part in ("anyOf", "oneOf", "allOf"):
            for sub in schema.get(part) or ():
                _walk_enums(sub, defs, out, key)
        if "items" in schema:
            _walk_enums(schema["items"], defs, out, key)


@cache
def registry_enums() -> dict[str, frozenset[str]]:
    """Property name → the enum values any registry tool declares for it."""
    out: dict[str, set[str]] = {}
    for name in TOOL_REGISTRY:
        schema = tool_parameters_schema(name)  # generated once per tool, references inlined
        _walk_enums(schema, schema.get("$defs", {}), out, None)
    return {k: frozenset(v) for k, v in out.items()}


def _is_id_key(key: str | None) -> bool:
    return key is not None and (key == "id" or key.endswith("Id") or key.endswith("Ids"))


def record_value(value: Any, key: str | None = None) -> Any:
    """The recordable form of one argument value (`key`: the property it sits under)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        if _is_id_key(key) and ID_PATTERN.match(value):
            return value
        if key == "sources" and SOURCE_PATTERN.match(value):
            return value
        if key is not None and value in registry_enums().get(key, ()):
            return value
        return digest(value)
    if isinstance(value, list | tuple):
        return [record_value(v, key) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        hidden = 0
        for k, v in value.items():
            if isinstance(k, str) and KEY_PATTERN.match(k):
                out[k] = record_value(v, k)
            else:  # a key the model invented is model text too
                hidden += 1
        if hidden:
            out["otherKeys"] = hidden
        return out
    return digest(str(value))


def record_args(raw: str) -> str:
    """Recorded form of a call's raw JSON arguments: ids, numbers, booleans, enums kept; every
    other string `{chars, sha256}`; commit paragraphs summarised as one `{count, chars, sha256}`."""
    try:
        value = json.loads(raw, strict=False) if raw.strip() else {}
    except (json.JSONDecodeError, RecursionError):
        return json.dumps({"invalidJson": len(raw)})
    if isinstance(value, dict) and isinstance(value.get("paragraphs"), list):
        paragraphs = [p for p in value["paragraphs"] if isinstance(p, str)]
        joined = "\n".join(paragraphs)
        value = dict(value, paragraphs=None)
        recorded = record_value(value)
        recorded["paragraphs"] = {"count": len(paragraphs), **digest(joined)}
    else:
        recorded = record_value(value)
    text = json.dumps(recorded, ensure_ascii=False, separators=(",", ":"))
    if len(text) > ARGS_RECORD_CAP:
        text = json.dumps({"truncated": True, "chars": len(raw), "sha256": digest(raw)["sha256"]})
    return text


TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def record_tool_name(name: str) -> str:
    """A tool name shaped like an identifier (a registry tool, or one outside the allow-list such
    as `claim_unit`: REL-5 records which) as is; anything else only as a digest (REL-9)."""
    if name in TOOL_REGISTRY or TOOL_NAME_PATTERN.match(name):
        return name
    return f"unregistered-{digest(name)['sha256'][:16]}"
