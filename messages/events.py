"""Events on `novel.events.<novelId>.<type>` (BUS-3). Safe echo only (BUS-6): ids, versions,
counts, hashes and states — never prose, prompts, model output or tokens."""

from novelbus.messages.base import Message


class Event(Message, frozen=True):
    novel_id: str


class NovelCreated(Event, tag="novel.created", frozen=True):
    title: str
    writer_mode: str
    outline_revision: str
    chapters: int
    scenes: int


class UnitPrepared(Event, tag="unit.prepared", frozen=True):
    unit_id: str
    chapter_id: str
    scene_id: str
    fragment: int


class UnitClaimed(Event, tag="unit.claimed", frozen=True):
    unit_id: str
    claim_id: str
    attempt: int
    mode: str


class PackRendered(Event, tag="pack.rendered", frozen=True):
    unit_id: str
    shape: str
    chars: int
    est_tokens: int
    prefix_sha256: str


class WriterDispatched(Event, tag="writer.dispatched", frozen=True):
    unit_id: str
    run_id: str
    dispatch: int
    provider: str


class ToolStarted(Event, tag="tool.started", frozen=True):
    run_id: str
    seq: int
    tool: str
    args: str  # truncated, prose replaced by counts (RUN-6)
    refused: bool = False


class WriterFinished(Event, tag="writer.finished", frozen=True):
    unit_id: str
    run_id: str
    ok: bool
    reason: str
    output_chars: int
    tool_calls: int


class UnitCommitted(Event, tag="unit.committed", frozen=True):
    unit_id: str
    commit_id: str
    effective_characters: int
    total_characters: int
    body_sha256: str
    context_sha256: str | None
    duplicate: bool = False


class VerificationFailed(Event, tag="verify.failed", frozen=True):
    unit_id: str
    run_id: str
    failure: str


class UnitRefused(Event, tag="unit.refused", frozen=True):
    """QUAL-3: the content gate refused a candidate (`novel.quality` code); counts only, never
    the candidate's text."""

    unit_id: str
    code: str  # no-letters | wrong-script | copies-outline | copies-prose | repetition | too-short
    shape: str  # W1 | W2 | inline
    paragraph_count: int  # not `paragraphs`: a reserved event key (prose), refused by the ledger
    characters: int  # effective characters of the refused candidate


class UnitFailed(Event, tag="unit.failed", frozen=True):
    unit_id: str
    reason: str
    signature: str
    dispatches: int
    missing_blocks: list[str] = []


class UnitSuperseded(Event, tag="unit.superseded", frozen=True):
    """A prepared unit retired automatically: its scene was removed by an outline revision."""

    unit_id: str
    chapter_id: str
    scene_id: str
    reason: str


class ClaimReleased(Event, tag="claim.released", frozen=True):
    unit_id: str
    reason: str


class ClaimsRecovered(Event, tag="claims.recovered", frozen=True):
    unit_ids: list[str]
    instance: str


class ScopeViolation(Event, tag="scope.violation", frozen=True):
    requested_unit_id: str
    delegated_unit_id: str


class DelegationRefused(Event, tag="delegation.refused", frozen=True):
    requested_unit_id: str
    code: str


class ToolRefused(Event, tag="tool.refused", frozen=True):
    run_id: str
    tool: str


class UsageSampled(Event, tag="usage.sampled", frozen=True):
    unit_id: str
    mode: str
    turn: int
    input_chars: int
    est_input_tokens: int
    output_chars: int
    window_peak_tokens: int
    calls: int
    # Wall time inside the provider's calls (ms), when the runner measured it: a latency figure,
    # not model output. Benchmarks subtract it to get the orchestration's own time per unit.
    model_ms: float | None = None


class UsageMissing(Event, tag="usage.missing", frozen=True):
    """REL-7: this turn's usage sample was not recorded (the sampler was away past the retry
    window, or the turn was accounted by reconciliation after its flow died); the turn counts."""

    unit_id: str
    claim_id: str
    turn: int
    reason: str


class WriterAbandoned(Event, tag="writer.abandoned", frozen=True):
    """REL-7: a writer run left `running` (its writer or driver died) was closed as `abandoned`."""

    unit_id: str
    run_id: str
    reason: str


class ChapterCompleted(Event, tag="chapter.completed", frozen=True):
    chapter_id: str


class NovelPaused(Event, tag="novel.paused", frozen=True):
    reason: str
    detail: str = ""


class NovelResumed(Event, tag="novel.resumed", frozen=True):
    pass


class ModeSwitched(Event, tag="novel.mode-switched", frozen=True):
    writer_mode: str


class NovelFinished(Event, tag="novel.finished", frozen=True):
    units: int
    commits: int
    characters: int


class OutlineRevised(Event, tag="outline.revised", frozen=True):
    """PLAN-1: counts and the new revision, never content (nor the reason, which is prose)."""

    revision: str
    parent: str | None
    seq: int
    chapters: int
    scenes: int
    superseded_units: int
    requirements_applied: int
    requirements_blocked: int
    requirements_superseded: int


class OutlineRequested(Event, tag="outline.requested", frozen=True):
    """PLAN-2: the novel paused `awaiting-outline`; whoever plans (a person, an external planner)
    is asked for a revision. `why`: no-outline | no-chapters | chapter-without-scenes |
    requirement-pending | next-chapter. Characters are effective characters; `remaining…` is
    null for an unbounded length budget."""

    why: str
    revision: str | None
    chapter_id: str | None
    committed_characters: int
    remaining_characters: int | None
    lower_remaining_characters: int | None
    next_chapter_order: int
    chapters: int
    planned_chapters: int | None
    pending_requirements: int


class ConfigChanged(Event, tag="novel.config-changed", frozen=True):
    """PLAN-5: which config fields changed (paths only; values are in `novelbus novel config`)."""

    fields: list[str]


class RequirementReceived(Event, tag="requirement.received", frozen=True):
    """PLAN-4: a directive entered the ledger — its id, sequence and message id, the size and
    SHA-256 of its text; never the text."""

    requirement_id: str
    sequence: int
    message_id: str
    chars: int
    sha256: str


class RequirementApplied(Event, tag="requirement.applied", frozen=True):
    requirement_id: str
    revision: str
    watermark: int
    resolved_by: str | None = None  # clarification | withdrawal, when it was blocked
    resolved_message_id: str | None = None


class RequirementBlocked(Event, tag="requirement.blocked", frozen=True):
    requirement_id: str
    revision: str


class RequirementSuperseded(Event, tag="requirement.superseded", frozen=True):
    requirement_id: str
    superseded_by: str
    revision: str
    watermark: int
    resolved_by: str | None = None
    resolved_message_id: str | None = None


class CanonExtracted(Event, tag="canon.extracted", frozen=True):
    """ROLE-3: the extractor read a commit's prose: counts and an outcome code only."""

    unit_id: str
    commit_id: str
    mode: str  # offline | model
    outcome: str  # extracted | bad-reply | provider-error
    proposed: int
    accepted: int  # new facts kept after the source check and de-duplication


class CandidateDetected(Event, tag="candidate.detected", frozen=True):
    """ROLE-2: the semantic detector checked a candidate: its claims' counts by verdict and the
    outcome code (pass | contradicted | evidence-gap | detector-unparsed), never a claim's text."""

    unit_id: str
    detector: str  # offline | model
    outcome: str
    supported: int
    contradicted: int
    unknown: int


NovelEvent = (
    NovelCreated | UnitPrepared | UnitClaimed | PackRendered | WriterDispatched | ToolStarted
    | WriterFinished | UnitCommitted | VerificationFailed | UnitRefused | UnitFailed | UnitSuperseded
    | ClaimReleased
    | ClaimsRecovered | ScopeViolation | DelegationRefused | ToolRefused | UsageSampled | UsageMissing
    | WriterAbandoned
    | ChapterCompleted | NovelPaused | NovelResumed | ModeSwitched | NovelFinished
    | OutlineRevised | OutlineRequested | ConfigChanged | RequirementReceived | RequirementApplied
    | RequirementBlocked | RequirementSuperseded
    | CanonExtracted | CandidateDetected
)
