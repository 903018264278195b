"""Role projections (CTX-8, ROLE-1): what each role's model may see, per the trusted-context visibility table.

The full frozen context stays inside the trusted boundary; each role gets a minimal projection,
a pure function beside the writer's pack (`novel.pack.render_writer_pack`). One module per role:
`writer.py`, `detector.py`, `judge.py`, `planner.py`, `extractor.py`, each exposing
``project(inputs: RoleInputs) -> dict[str, Any]`` that returns exactly what that role's model
gets (a JSON-ready dict) — never run, claim or delegation ids, permissions, manifests, hashes,
candidate versions, arm names, other candidates, raw paths or facts after the role's asOf.

The shared input convention is `RoleInputs`: the trusted reader builds it (in the store,
`store.load_role_inputs`; over an in-memory snapshot, `role_inputs_from_snapshot`), the projection
only picks fields from it. Which context each role is frozen with:

| role      | scenario    | asOf                                   | extra input                      |
|-----------|-------------|----------------------------------------|----------------------------------|
| writer    | generation  | the commit before the unit's own       | —                                |
| detector  | detection   | the commit before the unit's own       | `candidate` (the body under test)|
| judge     | detection   | the commit before the unit's own       | `candidate` (anonymous body)     |
| planner   | planning    | the commit before the unit's own       | `snapshot` (structure, no prose) |
| extractor | extraction  | the commit before the one it processes | `commit` (its paragraphs)        |

`project(role, inputs)` dispatches to the role's module (imported lazily, so a role whose module
is not there yet fails with `RoleInputError` naming it, and the others still work).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal

import msgspec

from novelbus.novel.body import CanonChange, CommitBody, SceneCompletion
from novelbus.novel.context import ContextInputError, FrozenContext, freeze_from_snapshot
from novelbus.novel.next_work import live_commits
from novelbus.novel.outline import Outline
from novelbus.novel.snapshot import CommitView, NovelSnapshot

Role = Literal["writer", "detector", "judge", "planner", "extractor"]
ROLES: tuple[Role, ...] = ("writer", "detector", "judge", "planner", "extractor")

# CTX-1: the scenario decides the functional contract each role's context is frozen under.
SCENARIO_OF: dict[str, str] = {
    "writer": "generation",
    "detector": "detection",
    "judge": "detection",
    "planner": "planning",
    "extractor": "extraction",
}
# Roles that review a candidate body (the unit's committed body by default).
CANDIDATE_ROLES: tuple[Role, ...] = ("detector", "judge")


class RoleInputError(ContextInputError):
    """A role request that cannot be served: an unknown role, or an input the role needs is missing."""


class Candidate(msgspec.Struct, frozen=True, rename="camel"):
    """The body under review (detector, judge): its paragraphs and the claims it declares. No
    version, hash, run or arm: the adapter binds those outside the projection (CTX-9, trusted
    binding)."""

    paragraphs: list[str]
    canon_changes: list[CanonChange] = []
    scene_completion: SceneCompletion | None = None


def candidate_body(candidate: Candidate) -> CommitBody:
    """The candidate as a commit body (a missing scene completion reads as not completed)."""
    completion = candidate.scene_completion or SceneCompletion(completed=False, basis="not declared")
    return CommitBody(paragraphs=list(candidate.paragraphs), scene_completion=completion,
                      canon_changes=list(candidate.canon_changes))


def parse_candidate(data: bytes) -> Candidate:
    """A candidate file: a JSON commit body (``{"paragraphs": [...], ...}``) or plain text whose
    paragraphs are separated by blank lines. Raises RoleInputError naming what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RoleInputError("the candidate file is not UTF-8 text") from None
    if text.lstrip().startswith("{"):
        try:
            body = msgspec.json.decode(text, type=CommitBody)
        except msgspec.ValidationError as e:
            raise RoleInputError(f"the candidate file is JSON but not a commit body: {e}") from None
        except msgspec.DecodeError:
            body = None
        if body is not None:
            return Candidate(paragraphs=body.paragraphs, canon_changes=body.canon_changes,
                             scene_completion=body.scene_completion)
    paragraphs = [" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n")]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        raise RoleInputError("the candidate file holds no paragraph")
    return Candidate(paragraphs=paragraphs)


class RoleInputs(msgspec.Struct, frozen=True):
    """Everything a role projection may read, built by the trusted reader (never shown whole).

    ``frozen``: the unit's frozen context under the role's scenario (`SCENARIO_OF`), at or before
    the role's asOf (CTX-4 proven). ``candidate``: detector and judge. ``commit``: the extractor's
    pending prose (the committed unit it processes, paragraphs included; its seq is asOf + 1).
    ``snapshot``: the planner's structural view at asOf (outline, units, commit index without
    prose). Fields a role does not use are None.
    """

    role: Role
    frozen: FrozenContext
    candidate: Candidate | None = None
    commit: CommitView | None = None
    snapshot: NovelSnapshot | None = None
    shape: Literal["full", "trimmed"] = "full"  # writer: the pack shape (W1 full, W2 trimmed)
    # extractor: the canon already recorded for the commit's chapter at or before asOf (events
    # included; the context's canon cards hold participants' states only), for de-duplication
    known_canon: list[CanonChange] = []
    # judge: the outline the candidates were written against, and the second anonymous text
    outline: Outline | None = None
    other: Candidate | None = None

    @property
    def as_of(self) -> int:
        return self.frozen.context.request.as_of


def check_role(role: str) -> Role:
    """The role, or RoleInputError naming the field and the allowed values."""
    if role not in ROLES:
        raise RoleInputError(f"unknown role {role!r}: --role must be one of {', '.join(ROLES)}")
    return role


def role_inputs(
    role: str,
    frozen: FrozenContext,
    *,
    candidate: Candidate | None = None,
    commit: CommitView | None = None,
    snapshot: NovelSnapshot | None = None,
    shape: Literal["full", "trimmed"] = "full",
    known_canon: list[CanonChange] | None = None,
    outline: Outline | None = None,
    other: Candidate | None = None,
) -> RoleInputs:
    """Check and bundle a role's inputs (pure): the context's scenario is the role's, and what
    the role needs is there — fail closed, never a projection from the wrong inputs."""
    name = check_role(role)
    scenario = frozen.context.request.scenario
    if scenario != SCENARIO_OF[name]:
        raise RoleInputError(
            f"the {name} projection needs a context of scenario {SCENARIO_OF[name]!r}, got {scenario!r}"
        )
    if name in CANDIDATE_ROLES and candidate is None:
        raise RoleInputError(f"the {name} projection needs a candidate (the body under review)")
    if name == "judge" and outline is None:
        raise RoleInputError("the judge projection needs the outline the candidates were written against")
    if name == "extractor":
        if commit is None:
            raise RoleInputError("the extractor projection needs the commit whose prose it reads")
        if commit.seq != frozen.context.request.as_of + 1:
            raise RoleInputError(
                f"the extractor reads commit seq {commit.seq} with a context at asOf "
                f"{frozen.context.request.as_of}; it must be asOf + 1"
            )
    if name == "planner":
        if snapshot is None:
            raise RoleInputError("the planner projection needs the structural snapshot")
        if snapshot.as_of_seq > frozen.context.request.as_of:
            raise RoleInputError(
                f"the planner's snapshot is at seq {snapshot.as_of_seq}, after asOf "
                f"{frozen.context.request.as_of}"
            )
    return RoleInputs(role=name, frozen=frozen, candidate=candidate, commit=commit, snapshot=snapshot,
                      shape=shape, known_canon=list(known_canon or []), outline=outline, other=other)


def planner_snapshot(snapshot: NovelSnapshot, as_of: int) -> NovelSnapshot:
    """The planner's structural view (pure): commits at or before ``as_of`` only, without prose."""
    commits = [msgspec.structs.replace(c, paragraphs=[]) for c in snapshot.commits if c.seq <= as_of]
    return msgspec.structs.replace(snapshot, commits=commits, as_of_seq=commits[-1].seq if commits else 0)


def committed_candidate(snapshot: NovelSnapshot, unit_id: str) -> Candidate:
    """The unit's committed body as the candidate (the default for detector and judge)."""
    for c in snapshot.commits:
        if c.unit_id == unit_id:
            if not c.paragraphs and c.paragraph_count:
                raise RoleInputError(f"the commit of unit {unit_id!r} was read without its prose")
            return Candidate(paragraphs=list(c.paragraphs), canon_changes=list(c.canon_changes),
                             scene_completion=c.scene_completion)
    raise RoleInputError(
        f"unit {unit_id!r} has no committed body: give the candidate to review (--candidate FILE)"
    )


def role_inputs_from_snapshot(
    role: str,
    snapshot: NovelSnapshot,
    unit_id: str,
    *,
    purpose: str = "production",
    profile: str = "bounded",
    as_of: int | None = None,
    candidate: Candidate | None = None,
    shape: Literal["full", "trimmed"] = "full",
    other: Candidate | None = None,
) -> RoleInputs:
    """Build a role's inputs over an in-memory snapshot with prose (pure; tests, benchmarks).

    The extractor processes the unit's own commit (asOf = the commit before it); the others get
    the unit's context at ``as_of`` (default: the commit before the unit's own). Detector and
    judge review ``candidate``, by default the unit's committed body.
    """
    name = check_role(role)
    commit = None
    if name == "extractor":
        commit = next((c for c in snapshot.commits if c.unit_id == unit_id), None)
        if commit is None:
            raise RoleInputError(f"unit {unit_id!r} has no commit for the extractor to read")
        as_of = commit.seq - 1
    frozen = freeze_from_snapshot(
        snapshot, unit_id, scenario=SCENARIO_OF[name], purpose=purpose, profile=profile, as_of=as_of
    )
    if name in CANDIDATE_ROLES and candidate is None:
        candidate = committed_candidate(snapshot, unit_id)
    view = planner_snapshot(snapshot, frozen.context.request.as_of) if name == "planner" else None
    known = None
    if commit is not None:
        known = chapter_canon(live_commits(snapshot), commit.chapter_id, commit.seq - 1)
    return role_inputs(name, frozen, candidate=candidate, commit=commit, snapshot=view, shape=shape,
                       known_canon=known, outline=snapshot.outline if name == "judge" else None, other=other)


def chapter_canon(commits: list[CommitView], chapter_id: str, as_of: int) -> list[CanonChange]:
    """The canon of a chapter's commits at or before ``as_of``, oldest first (pure)."""
    return [ch for c in commits if c.chapter_id == chapter_id and c.seq <= as_of for ch in c.canon_changes]


def project(role: str, inputs: RoleInputs) -> dict[str, Any]:
    """The role's projection (pure): ``novelbus.novel.roles.<role>``'s ``project_role(inputs)``
    or ``project(inputs)``, else its ``project`` called with what that role takes (`_call`)."""
    name = check_role(role)
    if inputs.role != name:
        raise RoleInputError(f"inputs built for role {inputs.role!r} handed to the {name} projection")
    try:
        module = importlib.import_module(f"novelbus.novel.roles.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"novelbus.novel.roles.{name}":
            raise
        raise RoleInputError(f"the {name} projection is not available in this build") from None
    direct = getattr(module, "project_role", None)
    if direct is None and len(inspect.signature(module.project).parameters) == 1:
        direct = module.project  # the convention: project(inputs)
    out: dict[str, Any] = direct(inputs) if direct is not None else _call(name, module.project, inputs)
    return out


def _call(name: Role, fn: Any, inputs: RoleInputs) -> Any:
    """Each role module's own ``project`` signature, fed from the inputs."""
    if name == "detector":
        assert inputs.candidate is not None  # role_inputs checked it
        return fn(inputs.frozen, candidate_body(inputs.candidate))
    if name == "judge":
        # The blind judge compares two anonymous texts; a pack shows the candidate as "A" and,
        # when one was given beside it, the other as "B" (else B is empty).
        assert inputs.candidate is not None
        l0 = inputs.frozen.context.l0
        outline = inputs.outline
        if outline is None:
            raise RoleInputError("the judge projection needs the outline")
        other = "\n\n".join(inputs.other.paragraphs) if inputs.other is not None else ""
        return fn(outline, l0.chapter.chapterId, l0.scene.sceneId, "\n\n".join(inputs.candidate.paragraphs), other)
    return fn(inputs)


__all__ = [
    "CANDIDATE_ROLES",
    "Candidate",
    "candidate_body",
    "parse_candidate",
    "ROLES",
    "Role",
    "RoleInputError",
    "RoleInputs",
    "SCENARIO_OF",
    "chapter_canon",
    "check_role",
    "committed_candidate",
    "planner_snapshot",
    "project",
    "role_inputs",
    "role_inputs_from_snapshot",
]
