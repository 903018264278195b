"""Licensed references (CTX-13, L3): only the scenarios that ask, only the purposes an
authorisation covers at the freeze date, in the writer pack's stable prefix, never in the
extractor's or the detector's inputs."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus.novel.context import (
    MAX_REFERENCES,
    NO_REFERENCES,
    ReferenceLayer,
    canonical_json,
    freeze_from_snapshot,
    refusal,
    validate_request,
)
from novelbus.novel.outline import NovelFile, OutlineError, Reference, parse_novel_file
from novelbus.novel.pack import parse_pack, render_writer_pack
from novelbus.novel.roles import project, role_inputs_from_snapshot
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.writers.tools import W2_ALLOW_LIST, call_read_tool, openai_tool_definitions
from tests.pure.sim import golden_body, snapshot_from_file, write_book

PHRASE = "quartz-lantern of Zanzibar"


def ref(rid: str = "voice-1", **kw: Any) -> dict[str, Any]:
    return {"referenceId": rid, "kind": "style", "text": f"The sea lay flat under the {PHRASE}.",
            "source": "the author's own notebook", "licence": "CC BY 4.0", "purposes": ["production"],
            "expires": None, **kw}


def novel_with(*refs: dict[str, Any], beside: bool = True) -> NovelFile:
    data = json.loads(sample_novel_bytes())
    if beside:
        data["references"] = list(refs)
    else:
        data["outline"]["references"] = list(refs)
    return parse_novel_file(json.dumps(data))


def book(nf: NovelFile) -> list[tuple[NovelSnapshot, str]]:
    return write_book(snapshot_from_file(nf), golden_body)


def test_references_beside_or_inside_the_outline_are_one_layer_and_leave_other_revisions_alone() -> None:
    """CTX-13: `references` beside `outline` or inside it parse to the same outline; an outline
    without references keeps its revision id (ADR 0007)."""
    assert novel_with(ref()).outline == novel_with(ref(), beside=False).outline
    plain = parse_novel_file(sample_novel_bytes())
    assert plain.outline.references == []
    assert snapshot_from_file(plain).outline_revision == snapshot_from_file(novel_with()).outline_revision
    assert snapshot_from_file(novel_with(ref())).outline_revision != snapshot_from_file(plain).outline_revision


def test_a_context_without_references_has_the_l3_bytes_it_always_had() -> None:
    """CTX-13 / ADR 0007: the empty layer encodes as before, so existing context hashes stand."""
    assert canonical_json(ReferenceLayer(patterns=[], note=NO_REFERENCES)) == (
        b'{"patterns":[],"note":"no licensed references are stored; L3 is empty for every scenario"}')


def test_a_production_style_sample_is_in_the_writer_packs_stable_prefix_and_in_no_other_roles_input() -> None:
    """CTX-13: the writer's pack shows the sample under `pattern-references` (and the
    `style-constraints`) inside the stable prefix, the same for every unit; the extractor's and
    the detector's projections never carry its text, and their manifests say why it was left out."""
    written = book(novel_with(ref()))
    prefixes = set()
    for snap, unit_id in written[:4]:
        frozen = freeze_from_snapshot(snap, unit_id, purpose="production")
        assert [c.reference_id for c in frozen.context.l3.references] == ["voice-1"]
        for shape in ("full", "trimmed"):
            pack = render_writer_pack(frozen, shape)  # type: ignore[arg-type]
            blocks = parse_pack(pack.text)
            assert any(PHRASE in line for line in blocks["pattern-references"])
            assert blocks["style-constraints"]
            assert PHRASE in pack.prefix
        prefixes.add(render_writer_pack(frozen, "trimmed").prefix)
    assert len(prefixes) <= 2  # PACK-3: only the chapter changes it
    final = written[-1][0]
    done = final.commits[-1].unit_id
    for role in ("extractor", "detector"):
        inputs = role_inputs_from_snapshot(role, final, done)
        assert PHRASE not in json.dumps(project(role, inputs), ensure_ascii=False)
        assert inputs.frozen.context.l3.references == []
        reasons = {(o.source_id, o.reason) for o in inputs.frozen.manifest.omitted if o.layer == "L3"}
        assert reasons == {("voice-1", f"not-requested:{inputs.frozen.context.request.scenario}")}


def test_an_expired_unlicensed_or_uncovered_reference_is_left_out_with_its_reason() -> None:
    """CTX-13: expired (at the freeze date), unlicensed, not covering the purpose, or with an
    expiry and no freeze date: left out of the context and the pack, the reason in the manifest."""
    nf = novel_with(ref("old", expires="2026-01-01"), ref("free", licence="none"),
                    ref("eval", purposes=["evaluation"]), ref("ok", expires="2030-01-01"))
    snap, unit_id = book(nf)[0]
    frozen = freeze_from_snapshot(snap, unit_id, purpose="production", references_on="2026-12-04")
    assert [c.reference_id for c in frozen.context.l3.references] == ["ok"]
    reasons = {o.source_id: o.reason for o in frozen.manifest.omitted if o.layer == "L3"}
    assert reasons == {"old": "expired:2026-01-01", "free": "unlicensed", "eval": "purpose-not-covered:production"}
    assert PHRASE in render_writer_pack(frozen, "full").text  # "ok" carries the phrase too
    undated = freeze_from_snapshot(snap, unit_id, purpose="production")
    assert {o.source_id: o.reason for o in undated.manifest.omitted if o.layer == "L3"}["ok"] == "expiry-unverifiable"
    evaluation = freeze_from_snapshot(snap, unit_id, purpose="evaluation", references_on="2026-12-04")
    assert [c.reference_id for c in evaluation.context.l3.references] == ["eval"]


def test_references_are_bounded_in_declaration_order() -> None:
    """CTX-13, CTX-5: at most MAX_REFERENCES, in the order declared; the rest omitted by the cap."""
    nf = novel_with(*(ref(f"r{i}") for i in range(MAX_REFERENCES + 2)))
    snap, unit_id = book(nf)[0]
    frozen = freeze_from_snapshot(snap, unit_id)
    assert [c.reference_id for c in frozen.context.l3.references] == [f"r{i}" for i in range(MAX_REFERENCES)]
    assert {o.source_id for o in frozen.manifest.omitted if o.reason == f"cap:{MAX_REFERENCES}"} == {"r4", "r5"}


@settings(max_examples=600)  # pure and fast; the admitted corner is about 1 in 50 draws
@given(
    scenario=st.sampled_from(["generation", "extraction", "planning", "detection"]),
    purpose=st.sampled_from(["production", "evaluation", "diagnostic"]),
    purposes=st.lists(st.sampled_from(["production", "evaluation", "diagnostic"]), unique=True),
    licence=st.sampled_from(["", "none", "CC BY 4.0", "own work", "Unknown"]),
    expires=st.one_of(st.none(), st.dates(date(2020, 1, 1), date(2030, 12, 31))),
    on=st.one_of(st.none(), st.dates(date(2020, 1, 1), date(2030, 12, 31)).map(date.isoformat)),
)
def test_a_reference_enters_only_when_scenario_licence_purpose_and_date_all_allow_it(
    scenario: str, purpose: str, purposes: list[str], licence: str, expires: date | None, on: str | None
) -> None:
    """CTX-13 (property): admitted ⇔ the scenario asks, a licence, the purpose covered
    (diagnostic as production), and no expiry or a known freeze date before it."""
    r = Reference.model_validate(ref(licence=licence, purposes=purposes,
                                     expires=None if expires is None else expires.isoformat()))
    request = validate_request(novel_id="n-1", unit_id="u-1", as_of=0, scenario=scenario, purpose=purpose,
                               profile="bounded")
    wanted = "production" if purpose == "diagnostic" else purpose
    admitted = (scenario == "generation" and licence.lower() not in ("", "none", "unknown")
                and wanted in purposes and (expires is None or (on is not None and on < expires.isoformat())))
    assert (refusal(r, request, on) is None) == admitted


def test_the_w2_read_tool_gives_the_references_the_pack_carries_under_the_same_authorisation() -> None:
    """CTX-13, TOOL-1: `novel_references_read` is in the W2 allow-list and the registry's tool
    definitions; it returns what the writer's context carries (production, the read's date),
    optionally of one kind, and never an expired, unlicensed or uncovered one."""
    nf = novel_with(ref("old", expires="2026-01-01"), ref("free", licence="none"), ref("eval", purposes=["evaluation"]),
                    ref("ok"), ref("card", kind="pattern", text="Open on weather; close on a choice."))
    snap = msgspec.structs.replace(snapshot_from_file(nf), read_on="2026-12-04")
    assert "novel_references_read" in W2_ALLOW_LIST
    assert "novel_references_read" in {t["function"]["name"] for t in openai_tool_definitions(W2_ALLOW_LIST)}
    rows = call_read_tool(snap, "novel_references_read", {})["rows"]
    assert [r["referenceId"] for r in rows] == ["ok", "card"]
    assert set(rows[0]) == {"referenceId", "kind", "text", "source"}
    assert [r["referenceId"] for r in call_read_tool(snap, "novel_references_read", {"kind": "pattern"})["rows"]] == [
        "card"]
    undated = call_read_tool(msgspec.structs.replace(snap, read_on=None), "novel_references_read", {})["rows"]
    assert [r["referenceId"] for r in undated] == ["ok", "card"]  # none of them expires
    frozen = freeze_from_snapshot(book(nf)[0][0], book(nf)[0][1], references_on="2026-12-04")
    assert [c.reference_id for c in frozen.context.l3.references] == [r["referenceId"] for r in rows]


def test_two_arms_that_differ_by_references_alone_differ_in_the_manifest_only_where_references_show() -> None:
    """CTX-13 (a study arm may differ by references alone): the same unit frozen with and without
    a reference differs in the outline revision, the L3 entries and the L3 digest, and keeps the
    outline digest without references, every other layer digest and every other source."""
    with_refs, without = (freeze_from_snapshot(*book(nf)[2]) for nf in (novel_with(ref()), novel_with()))
    a, b = with_refs.manifest, without.manifest
    assert a.outline_revision != b.outline_revision and a.outline_sha256 == b.outline_sha256 != ""
    assert a.layers["L3"] != b.layers["L3"]
    assert {k: v for k, v in a.layers.items() if k != "L3"} == {k: v for k, v in b.layers.items() if k != "L3"}
    assert [s for s in a.sources if s.layer != "L3"] == b.sources
    assert [s.source_id for s in a.sources if s.layer == "L3"] == ["voice-1"]


def test_a_bad_reference_is_refused_naming_the_field() -> None:
    """CTX-13: a reference with an impossible expiry, an unknown kind or purpose, or a blank
    text is refused when the novel file is read, naming the field."""
    for bad, field in (({"expires": "2026-02-30"}, "expires"), ({"kind": "voice"}, "kind"),
                       ({"purposes": ["marketing"]}, "purposes"), ({"text": "   "}, "text")):
        with pytest.raises(OutlineError, match=field):
            novel_with(ref(**bad))
    with pytest.raises(OutlineError, match="references"):
        novel_with(ref(), ref())  # the same id twice
