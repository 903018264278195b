"""One claim's unit flow as a pure state machine (HOUSE-7): state and event in, state and commands out.

From a granted claim to its recorded turn: dispatch → (detector evidence) → render pack → run the
writer, which commits through the claim manager → verify the landed commit → record the turn.
Like a deterministic workflow, the decisions live here and the driver's actor
(`actors.unit_flow`) only carries the commands out and feeds their replies back as events —
no I/O, no clock, no randomness (the run ids derive from a nonce given at the start).

Every command that waits for a reply carries a step number; an event answers the command of its
step, and any other event (a late reply, the same reply twice) changes nothing. After `Done`
nothing is issued. The store, not a reply, says whether a commit landed (VER-1): a failed run or
an interrupted flow asks it (`CheckLanded`, `Settle`) before the unit counts as failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from novelbus.messages import runs as rm
from novelbus.messages.errors import (
    BUS_UNAVAILABLE,
    DELEGATION_NOT_FOUND,
    DISPATCH_LIMIT,
    PACK_ERROR,
)
from novelbus.novel.after_turn import WINDOW_EXCEEDED
from novelbus.novel.quality import refused_code

UNIT_NOT_CLAIMED = "unit-not-claimed"  # CTX-14: the writer refused a run whose claim is not live
Shape = Literal["W1", "W2", "inline"]
Phase = Literal["dispatch", "evidence", "pack", "run", "landed", "verify", "settle", "record", "done"]


class FlowSpec(msgspec.Struct, frozen=True):
    """What a flow is started with: the claim, the novel's writer shape and whether its detector
    is on (ROLE-2), and `nonce`, from which the flow's run ids are made."""

    novel_id: str
    unit_id: str
    claim_id: str
    shape: Shape
    detector: bool
    nonce: str
    first_dispatch: int | None = None  # PERF-2: the claim reply's dispatch grant


class UnitOutcome(msgspec.Struct, frozen=True):
    """How the turn ended, for its record (DRV-4, USE-1): every dispatch's run, for usage."""

    ok: bool
    reason: str
    dispatches: int
    missing_blocks: tuple[str, ...] = ()
    output_chars: int = 0
    runs: tuple[rm.WriterResult, ...] = ()


# --- commands (what the actor carries out) --------------------------------------------------------


class BeginDispatch(msgspec.Struct, frozen=True, tag=True):
    step: int


class ReadEvidence(msgspec.Struct, frozen=True, tag=True):
    """ROLE-2: what the detector found missing so far under this claim, for a fresh writer."""

    step: int


class RenderPack(msgspec.Struct, frozen=True, tag=True):
    step: int
    evidence: tuple[str, ...]


class RunWriter(msgspec.Struct, frozen=True, tag=True):
    """A fresh writer; it commits through the claim manager, where the candidate is checked once."""

    step: int
    run_id: str
    dispatch: int
    pack_text: str
    context_sha256: str | None


class CheckLanded(msgspec.Struct, frozen=True, tag=True):
    """VER-1: does the store hold this claim's commit (a failed run's commit reply may be lost)?"""

    step: int


class Verify(msgspec.Struct, frozen=True, tag=True):
    step: int
    run_id: str


class EmitVerificationFailed(msgspec.Struct, frozen=True, tag=True):
    """VER-4: published; no reply is awaited."""

    run_id: str
    failure: str


class Settle(msgspec.Struct, frozen=True, tag=True):
    """An interrupted flow: committed under this claim → `Settled(landed=True)`; otherwise the
    claim goes back to prepared (STORE-4) and `Settled(landed=False)`."""

    step: int
    reason: str


class RecordTurn(msgspec.Struct, frozen=True, tag=True):
    """Account the turn once (REL-2, REL-7), then what comes next (DRV-6)."""

    step: int
    outcome: UnitOutcome


DoneResult = Literal["recorded", "released", "unsettled", "unrecorded"]


class Done(msgspec.Struct, frozen=True, tag=True):
    """The end. `released`: the claim went back, nothing recorded — `notice` says why when the
    flow itself asks for its novel's next step (`claim-lost`), else the interrupting error
    (`error`) is the caller's to raise (REL-6: the notice is retried). `unsettled`: settling
    failed too; the novel's next step settles it first (REL-7)."""

    result: DoneResult
    notice: str | None = None
    error: str | None = None


Command = (BeginDispatch | ReadEvidence | RenderPack | RunWriter | CheckLanded | Verify | EmitVerificationFailed
           | Settle | RecordTurn | Done)


# --- events (replies, fed back by the actor) ------------------------------------------------------


class DispatchGranted(msgspec.Struct, frozen=True, tag=True):
    step: int
    dispatch: int


class EvidenceRead(msgspec.Struct, frozen=True, tag=True):
    step: int
    evidence: tuple[str, ...]


class PackRendered(msgspec.Struct, frozen=True, tag=True):
    step: int
    text: str
    context_sha256: str | None


class WriterFinished(msgspec.Struct, frozen=True, tag=True):
    step: int
    result: rm.WriterResult


class Landed(msgspec.Struct, frozen=True, tag=True):
    step: int
    landed: bool


class Verified(msgspec.Struct, frozen=True, tag=True):
    step: int
    ok: bool
    failure: str | None = None


class Settled(msgspec.Struct, frozen=True, tag=True):
    step: int
    landed: bool


class TurnRecorded(msgspec.Struct, frozen=True, tag=True):
    step: int


class Refused(msgspec.Struct, frozen=True, tag=True):
    """An error reply with its stable code (BUS-4); `missing_blocks` for a pack error (PACK-4)."""

    step: int
    code: str
    missing_blocks: tuple[str, ...] = ()


class Unavailable(msgspec.Struct, frozen=True, tag=True):
    """No reply in time, or NATS or PostgreSQL away (REL-6); `code` names the error."""

    step: int
    code: str


Event = (DispatchGranted | EvidenceRead | PackRendered | WriterFinished | Landed | Verified | Settled
         | TurnRecorded | Refused | Unavailable)


class FlowState(msgspec.Struct, frozen=True):
    spec: FlowSpec
    phase: Phase
    step: int = 0  # the awaited command's step
    dispatches: int = 0
    reasons: tuple[str, ...] = ()
    runs: tuple[rm.WriterResult, ...] = ()
    run_id: str | None = None
    outcome: UnitOutcome | None = None  # what RecordTurn records
    lost: bool = False  # settling a lost claim (CLM-4): a released claim asks for the next step itself
    error: str | None = None  # what interrupted the flow


Step = tuple[FlowState, list[Command]]


def run_id_of(nonce: str, dispatch: int) -> str:
    """The run id of a flow's dispatch: known before the run, the same on a replay."""
    return f"run-{nonce}-{dispatch}"


def start(spec: FlowSpec) -> Step:
    """A granted claim: its first dispatch (granted with the claim, or asked for)."""
    state = FlowState(spec=spec, phase="dispatch")
    if spec.first_dispatch is not None:
        return _dispatched(state, spec.first_dispatch)
    return _ask_dispatch(state)


def resume(spec: FlowSpec, reason: str = "flow-interrupted") -> Step:
    """REL-7: a flow of this claim that was interrupted and not settled (its process restarted,
    or settling failed) is settled before its novel moves on."""
    return _settle(FlowState(spec=spec, phase="settle"), reason)


def advance(state: FlowState, event: Event) -> Step:
    """The next state and commands for `event`; a reply to anything but the awaited command, or
    any event after the end, changes nothing."""
    if state.phase == "done" or event.step != state.step:
        return state, []
    match state.phase, event:
        case "dispatch", DispatchGranted(dispatch=dispatch):
            return _dispatched(state, dispatch)
        case "dispatch", Refused(code=code) if code == DISPATCH_LIMIT:  # DRV-4: the claim used its dispatches
            return _failed(state)
        case "dispatch", Refused(code=code) if code == DELEGATION_NOT_FOUND:  # CLM-4: instance restarted
            return _settle(state, "claim-lost", lost=True)
        case "dispatch", Unavailable(code=code) if code == BUS_UNAVAILABLE:  # CLM-5: its instance is away
            return _settle(state, "claim-lost", lost=True)
        case "evidence", EvidenceRead(evidence=evidence):
            return _issue(state, "pack", lambda step: RenderPack(step=step, evidence=evidence))
        case "pack", PackRendered(text=text, context_sha256=sha):
            run_id = run_id_of(state.spec.nonce, state.dispatches)
            return _issue(msgspec.structs.replace(state, run_id=run_id), "run", lambda step: RunWriter(
                step=step, run_id=run_id, dispatch=state.dispatches, pack_text=text, context_sha256=sha))
        case "pack", Refused(code=code, missing_blocks=missing) if code == PACK_ERROR:  # PACK-4: no writer starts
            return _record(state, UnitOutcome(False, PACK_ERROR, state.dispatches, missing_blocks=missing,
                                              runs=state.runs))
        case "run", WriterFinished(result=result):
            state = msgspec.structs.replace(state, runs=(*state.runs, result))
            if result.ok:  # VER-1: the store says whether it landed under this claim
                run_id = state.run_id or result.run_id
                return _issue(state, "verify", lambda step: Verify(step=step, run_id=run_id))
            state = msgspec.structs.replace(state, reasons=(*state.reasons, result.reason))
            return _issue(state, "landed", lambda step: CheckLanded(step=step))
        case "run", Refused(code=code) if code == UNIT_NOT_CLAIMED:  # CTX-14: the claim ended first
            return _settle(state, "claim-lost", lost=True)
        case "landed", Landed(landed=True):  # the commit went through, its reply did not come
            return _succeeded(state)
        case "landed", Landed(landed=False):
            reason = state.reasons[-1]
            if reason == WINDOW_EXCEEDED or refused_code(reason) is not None:
                return _failed(state)  # MODEL-5: deterministic; QUAL-3: refused after its repair turn
            return _ask_dispatch(state)
        case "verify", Verified(ok=True):
            return _succeeded(state)
        case "verify", Verified(failure=failure):
            failed = failure or "unknown"
            state = msgspec.structs.replace(state, reasons=(*state.reasons, f"verify:{failure}"))
            next_state, commands = _ask_dispatch(state)
            return next_state, [EmitVerificationFailed(run_id=state.run_id or "", failure=failed), *commands]
        case "settle", Settled(landed=True):  # VER-1: committed under this claim: a success to record
            return _record(state, UnitOutcome(True, "committed", 0))
        case "settle", Settled(landed=False):
            return _done(state, Done("released", notice="claim-lost" if state.lost else None,
                                     error=None if state.lost else state.error))
        case "settle", Refused() | Unavailable():  # settling failed too: left for the next step (REL-7)
            return _done(state, Done("unsettled", error=state.error))
        case "record", TurnRecorded():
            return _done(state, Done("recorded"))
        case "record", Refused(code=code) | Unavailable(code=code):
            return _done(state, Done("unrecorded", error=code))
        case _, Refused(code=code) | Unavailable(code=code):  # REL-6: anything else interrupts the flow
            return _settle(msgspec.structs.replace(state, error=code), "flow-interrupted")
    return state, []  # an event of another kind than the awaited command's reply


def _issue(state: FlowState, phase: Phase, command: Callable[[int], Command]) -> Step:
    """The one command the next phase awaits, numbered by the step it is answered under."""
    step = state.step + 1
    return msgspec.structs.replace(state, phase=phase, step=step), [command(step)]


def _ask_dispatch(state: FlowState) -> Step:
    return _issue(state, "dispatch", lambda step: BeginDispatch(step=step))


def _dispatched(state: FlowState, dispatch: int) -> Step:
    state = msgspec.structs.replace(state, dispatches=dispatch)
    if state.runs and state.spec.detector:  # ROLE-2: a fresh writer gets what the detector missed
        return _issue(state, "evidence", lambda step: ReadEvidence(step=step))
    return _issue(state, "pack", lambda step: RenderPack(step=step, evidence=()))


def _output_chars(state: FlowState) -> int:
    return state.runs[-1].output_chars if state.runs else 0


def _succeeded(state: FlowState) -> Step:
    return _record(state, UnitOutcome(True, "committed", state.dispatches, output_chars=_output_chars(state),
                                      runs=state.runs))


def _failed(state: FlowState) -> Step:
    reason = state.reasons[-1] if state.reasons else DISPATCH_LIMIT
    return _record(state, UnitOutcome(False, reason, state.dispatches, output_chars=_output_chars(state),
                                      runs=state.runs))


def _record(state: FlowState, outcome: UnitOutcome) -> Step:
    state = msgspec.structs.replace(state, outcome=outcome)
    return _issue(state, "record", lambda step: RecordTurn(step=step, outcome=outcome))


def _settle(state: FlowState, reason: str, *, lost: bool = False) -> Step:
    state = msgspec.structs.replace(state, lost=lost)
    return _issue(state, "settle", lambda step: Settle(step=step, reason=reason))


def _done(state: FlowState, done: Done) -> Step:
    return msgspec.structs.replace(state, phase="done", step=state.step + 1), [done]
