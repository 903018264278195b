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
import re
import time
from collections.abc import Sequence
from typing import Any, Literal

from novelbus.novel.commitcheck import BodyError, parse_draft_lenient
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.provider import ModelProvider, ProviderError, complete

Mechanism = Literal["json_schema", "json_object+schema", "json_object", "prompt"]
MECHANISMS: tuple[Mechanism, ...] = ("json_schema", "json_object+schema", "json_object", "prompt")
ENV_STRUCTURED = "NOVELBUS_MODEL_STRUCTURED"  # force a mechanism, skipping P6's choice


# llama.cpp's grammar parser refuses (and llama-cpp-python's server dies on) a grammar of more than
# about 2,000 rules; a string bounded at N characters costs N of them, an unbounded one a few, and
# all paragraphs share one item rule. 600 characters per paragraph plus the notes stays well inside;
# a long unit gets more paragraphs (up to MAX_PARAGRAPHS), never longer ones.
MAX_PARAGRAPH_CHARS = 600
MAX_PARAGRAPHS = 128
RAW_PER_EFFECTIVE = 1.25  # prose has about a fifth more characters than letters and digits
SHORT_CHARS = 120  # basis, goals, summaries: notes, not prose
NOTE_CHARS = 100  # nextAnchor, a canon change's detail
ID_CHARS = 64  # characterIds, foreshadowingId: outline ids (novel.outline.ID_PATTERN)
MAX_CANON_CHANGES = 3  # a scene may pay off two foreshadowing items beside one fact
# Digits bounded: a grammar-constrained small model may otherwise write digits until the reply's cap.
SOURCE_PATTERN = "^(inline(#[0-9]{1,4})?|commit-[1-9][0-9]{0,8}(#[0-9]{1,4})?)$"
INLINE_SOURCE_PATTERN = "^inline(#[0-9]{1,4})?$"
_COMMIT_ID = re.compile(r"\bcommit-[1-9][0-9]{0,8}\b")


def unit_target_max(pack_text: str) -> int | None:
    """`targetMax` of the pack's [[unit]] block (characters), when it has one."""
    from novelbus.novel.pack import pack_fields

    try:
        fields = pack_fields(pack_text).get("unit", {})
        value = int(fields.get("targetMax", ""))
    except (ValueError, TypeError, AttributeError):
        return None
    return value if value > 0 else None


def body_schema() -> dict[str, Any]:
    """QUAL-1: the commit body's JSON Schema, generated from the one definition
    (`novel.body.CommitArgs`, via the commit tool's parameters, TOOL-1) with the unit id left out:
    the W1 draft, the forced commit and the tool all list the same fields."""
    from novelbus.writers.tools import COMMIT_TOOL, tool_parameters_schema

    schema = tool_parameters_schema(COMMIT_TOOL)
    schema["properties"].pop("unitId", None)
    schema["required"] = [r for r in schema.get("required", []) if r != "unitId"]
    return schema


def _bound_string(node: dict[str, Any], max_length: int, *, min_length: int = 1) -> None:
    """Bound a string (or the string branch of a nullable one)."""
    for branch in node.get("anyOf", [node]):
        if branch.get("type") == "string":
            branch["minLength"] = min_length
            branch["maxLength"] = max_length


def bounded(schema: dict[str, Any], *, target_max: int | None = None,
            max_paragraphs: int | None = None) -> dict[str, Any]:
    """The body schema with the draft's constraints, honoured by grammar-constrained servers:
    non-empty paragraphs and notes, canon sources in their allowed forms, short notes, and, from
    the unit's range, a bound on each paragraph's length and on the paragraph count."""
    props = schema["properties"]
    paragraphs = props["paragraphs"]
    paragraphs["minItems"] = 1
    paragraphs["items"]["minLength"] = 1
    if target_max is not None:
        paragraphs["items"]["maxLength"] = max(40, min(int(target_max * RAW_PER_EFFECTIVE), MAX_PARAGRAPH_CHARS))
        paragraphs["maxItems"] = max_paragraphs or max(
            1, min(MAX_PARAGRAPHS, -(-int(target_max * RAW_PER_EFFECTIVE) // MAX_PARAGRAPH_CHARS)))
    elif max_paragraphs is not None:
        paragraphs["maxItems"] = max_paragraphs
    completion = props["sceneCompletion"]["properties"]
    _bound_string(completion["basis"], SHORT_CHARS)
    completion["outstandingGoals"]["maxItems"] = 2
    _bound_string(completion["outstandingGoals"]["items"], SHORT_CHARS)
    _bound_string(completion["nextAnchor"], NOTE_CHARS)
    changes = props["canonChanges"]
    changes["maxItems"] = MAX_CANON_CHANGES
    change = changes["items"]["properties"]
    _bound_string(change["summary"], SHORT_CHARS)
    _bound_string(change["detail"], NOTE_CHARS)
    _bound_string(change["foreshadowingId"], ID_CHARS)
    change["characterIds"]["maxItems"] = 3
    _bound_string(change["characterIds"]["items"], ID_CHARS)
    change["sources"].update(minItems=1, maxItems=1)
    change["sources"]["items"]["pattern"] = SOURCE_PATTERN
    # canonChanges is asked for (an empty list is fine): a model that must write it considers it
    schema["required"] = [*schema["required"], *(["canonChanges"] if "canonChanges" not in
                                                 schema["required"] else [])]
    return schema


def draft_schema(*, target_max: int | None = None, max_paragraphs: int | None = None,
                 shown_commits: Sequence[str] | None = None) -> dict[str, Any]:
    """The W1 draft's JSON Schema (MODEL-2, QUAL-1): the commit body's, bounded for the unit.
    With `shown_commits` (the commit ids the pack shows, `pack_commit_ids`), a canon source is
    this unit's own paragraphs or one of those: the store knows no other (STORE-3)."""
    schema = bounded(body_schema(), target_max=target_max, max_paragraphs=max_paragraphs)
    if shown_commits is not None:
        names = "|".join(sorted(set(shown_commits)))
        pattern = f"^(inline|{names})(#[0-9]{{1,4}})?$" if names else INLINE_SOURCE_PATTERN
        schema["properties"]["canonChanges"]["items"]["properties"]["sources"]["items"]["pattern"] = pattern
    return schema


def pack_commit_ids(pack_text: str) -> list[str]:
    """The commit ids a pack shows (its canon facts name the commit each came from), in order."""
    return list(dict.fromkeys(_COMMIT_ID.findall(pack_text)))


def commit_schema(unit_id: str, *, target_max: int | None = None) -> dict[str, Any]:
    """MODEL-3: the parameters of a forced `novel_body_commit`: the draft schema with `unitId`
    pinned to the delegated unit (the host still refuses any other unit, RUN-3)."""
    schema = draft_schema(target_max=target_max, shown_commits=())  # PROTOCOL_W2: sources are inline
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
    "You write fiction. Reply with one JSON object only, with the fields paragraphs (a list of "
    "prose paragraphs), sceneCompletion (an object: completed, true or false, and basis, why) and "
    "canonChanges (a list, which may be empty)."
)
P6_USER = "Write one short paragraph: a ferry pilot hears a harbour bell ring with no wind."
# The draft schema grew optional fields (QUAL-1) a small model fills under a grammar: 160 tokens
# cut the embedded 135M model's every reply; its short paragraph is bounded by P6_TARGET_MAX.
P6_MAX_TOKENS = 512
P6_TARGET_MAX = 300


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
    schema = draft_schema(target_max=P6_TARGET_MAX, max_paragraphs=2)
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
