"""Structured W1 drafts (MODEL-2): ask the server for the draft's JSON Schema.

Mechanisms, best first — chosen per model and server by probe P6 (`probe_structured`):

| mechanism | request | servers |
|---|---|---|
| `json_schema` | `response_format: {"type": "json_schema", "json_schema": {name, schema, strict}}` | OpenAI, vLLM, llama.cpp's `llama-server` |
| `json_object+schema` | `response_format: {"type": "json_object", "schema": …}` | llama-cpp-python's server |
| `json_object` | `response_format: {"type": "json_object"}` | most |
| `prompt` | none: the instruction alone | any |

The schema carries the draft's constraints (non-empty paragraphs and basis, the scene-completion
and canon-change shapes). A reply is parsed leniently (raw control characters inside strings)
and then validated strictly against the commit schema (`novel.commitcheck.parse_draft_lenient`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

from novelbus.novel.commitcheck import BodyError, parse_draft_lenient
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.provider import ModelProvider, ProviderError, complete

Mechanism = Literal["json_schema", "json_object+schema", "json_object", "prompt"]
MECHANISMS: tuple[Mechanism, ...] = ("json_schema", "json_object+schema", "json_object", "prompt")
ENV_STRUCTURED = "NOVELBUS_MODEL_STRUCTURED"  # force a mechanism, skipping P6's choice


# llama.cpp's grammar parser refuses (and llama-cpp-python's server dies on) a grammar of more than
# about 2,000 rules; a string bounded at N characters costs N of them. 600 per paragraph plus the
# notes stays well inside; longer units get more paragraphs instead.
MAX_PARAGRAPH_CHARS = 600
SHORT_CHARS = 120  # basis, goals, summaries: notes, not prose
SOURCE_PATTERN = "^(inline(#[0-9]+)?|commit-[1-9][0-9]*(#[0-9]+)?)$"


def unit_target_max(pack_text: str) -> int | None:
    """`targetMax` of the pack's [[unit]] block (characters), when it has one."""
    from novelbus.novel.pack import pack_fields

    try:
        fields = pack_fields(pack_text).get("unit", {})
        value = int(fields.get("targetMax", ""))
    except (ValueError, TypeError, AttributeError):
        return None
    return value if value > 0 else None


def draft_schema(*, target_max: int | None = None, max_paragraphs: int | None = None) -> dict[str, Any]:
    """The W1 draft's JSON Schema: the commit body with its constraints — non-empty paragraphs
    and basis, canon sources in their allowed forms, and, from the unit's range, a bound on each
    paragraph's length and on the paragraph count (honoured by grammar-constrained servers)."""
    paragraph: dict[str, Any] = {"type": "string", "minLength": 1}
    paragraphs: dict[str, Any] = {"type": "array", "minItems": 1, "items": paragraph}
    if target_max is not None:
        paragraph["maxLength"] = max(40, min(target_max, MAX_PARAGRAPH_CHARS))
        paragraphs["maxItems"] = max_paragraphs or max(1, min(8, -(-target_max // MAX_PARAGRAPH_CHARS)))
    elif max_paragraphs is not None:
        paragraphs["maxItems"] = max_paragraphs
    short = {"type": "string", "minLength": 1, "maxLength": SHORT_CHARS}
    return {
        "type": "object",
        "properties": {
            "paragraphs": paragraphs,
            "sceneCompletion": {
                "type": "object",
                "properties": {
                    "completed": {"type": "boolean"},
                    "basis": short,
                    "outstandingGoals": {"type": "array", "maxItems": 2, "items": short},
                },
                "required": ["completed", "basis"],
                "additionalProperties": False,
            },
            "canonChanges": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"enum": ["event", "character-state", "relation",
                                          "foreshadowing", "variable"]},
                        "summary": short,
                        "sources": {"type": "array", "minItems": 1, "maxItems": 1,
                                    "items": {"type": "string", "pattern": SOURCE_PATTERN}},
                    },
                    "required": ["kind", "summary", "sources"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["paragraphs", "sceneCompletion", "canonChanges"],
        "additionalProperties": False,
    }


def commit_schema(unit_id: str, *, target_max: int | None = None) -> dict[str, Any]:
    """MODEL-3: the parameters of a forced `novel_body_commit`: the draft schema with `unitId`
    pinned to the delegated unit (the host still refuses any other unit, RUN-3)."""
    schema = draft_schema(target_max=target_max)
    schema["properties"] = {"unitId": {"type": "string", "enum": [unit_id]}, **schema["properties"]}
    schema["required"] = ["unitId", *schema["required"]]
    return schema


def response_format(mechanism: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    if mechanism == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": "draft", "schema": schema, "strict": False}}
    if mechanism == "json_object+schema":
        return {"type": "json_object", "schema": schema}
    if mechanism == "json_object":
        return {"type": "json_object"}
    if mechanism == "prompt":
        return None
    raise ValueError(f"unknown structured-output mechanism {mechanism!r}; use one of {MECHANISMS}")


def mechanism_override(env: dict[str, str] | None = None) -> Mechanism | None:
    raw = (os.environ if env is None else env).get(ENV_STRUCTURED, "").strip()
    if not raw:
        return None
    if raw not in MECHANISMS:
        raise ProviderError("provider-config",
                            f"{ENV_STRUCTURED} must be one of {', '.join(MECHANISMS)}, got {raw!r}")
    return raw


# --- P6 ------------------------------------------------------------------------------------------

P6_SYSTEM = (
    "You write fiction. Reply with one JSON object only: "
    '{"paragraphs": ["..."], "sceneCompletion": {"completed": true, "basis": "..."}, '
    '"canonChanges": []}.'
)
P6_USER = "Write one short paragraph: a ferry pilot hears a harbour bell ring with no wind."
P6_MAX_TOKENS = 160


class StructuredProbe:
    """P6's verdict: which mechanism produced a valid draft, with evidence per mechanism tried."""

    def __init__(self, mechanism: Mechanism | None, evidence: list[str]) -> None:
        self.mechanism = mechanism
        self.evidence = evidence

    @property
    def status(self) -> str:
        return "pass" if self.mechanism is not None else "fail"

    def text(self) -> str:
        head = (f"drafts requested as {self.mechanism} validate against the commit schema"
                if self.mechanism else "no mechanism produced a valid draft")
        return head + ": " + "; ".join(self.evidence)


async def probe_structured(provider: ModelProvider, *, known: Mechanism | None = None) -> StructuredProbe:
    """P6: try the mechanisms best-first (from `known` when the server's is known); the first
    whose reply validates against the commit schema is chosen. A server that rejects a
    mechanism (HTTP 4xx) moves the probe on to the next."""
    order = MECHANISMS[MECHANISMS.index(known):] if known else MECHANISMS
    schema = draft_schema(max_paragraphs=2)
    evidence: list[str] = []
    for mechanism in order:
        started = time.monotonic()
        messages = [system_message(P6_SYSTEM), user_message(P6_USER)]
        try:
            reply = await complete(provider, messages, None, max_output_tokens=P6_MAX_TOKENS,
                                   response_format=response_format(mechanism, schema))
        except ProviderError as e:
            # Servers refuse an unsupported mechanism with a 400 or, some, a 500: try the next.
            evidence.append(f"{mechanism}: refused by the server ({e.code})")
            if e.code == "provider-config":
                break
            continue
        took = time.monotonic() - started
        try:
            parse_draft_lenient(reply.text or "")
        except BodyError as e:
            evidence.append(f"{mechanism}: reply is not a valid draft ({e.code}, {took:.1f} s)")
            continue
        evidence.append(f"{mechanism}: valid draft in {took:.1f} s")
        return StructuredProbe(mechanism, evidence)
    return StructuredProbe(None, evidence)
