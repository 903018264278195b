"""HOUSE-7: the pure unit flow (`novel.unit_flow`) driven through any order of replies, timeouts,
redeliveries and restarts, against a model of the world it talks to (claim manager, writer,
store). Whatever happens: at most one commit per unit and none dispatched after it landed, every
landed commit recorded once as a committed turn of its claim and no failed turn for it, one
record per flow, and nothing issued after the end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from novelbus.messages import runs as rm
from novelbus.messages.errors import DELEGATION_NOT_FOUND, DISPATCH_LIMIT, PACK_ERROR
from novelbus.novel import unit_flow as flow
from novelbus.novel.after_turn import WINDOW_EXCEEDED
from novelbus.novel.quality import refusal_reason

Advance = Callable[[flow.FlowState, flow.Event], flow.Step]
LIMIT = 3  # writerDispatchLimit
CLAIMS = 4  # claims of the unit the scenario tries before it stops
ACTIONS = st.sampled_from(["reply", "reply", "reply", "twice", "stale", "timeout", "lost", "restart"])
CALM = st.just("reply")  # the outage is over (REL-6: a server away for a while)
RUNS = st.sampled_from(["commits", "fails", "refused", "window"])
SHAPES = st.sampled_from(["W1", "W2", "inline"])
FIRST = st.sampled_from([None, 1])
PACKS = st.integers(0, 9)


def result(run_id: str, ok: bool, reason: str = "completed") -> rm.WriterResult:
    return rm.WriterResult(run_id=run_id, unit_id="u-1", ok=ok, reason=reason, provider="model", output_chars=10,
                           tool_calls=0, tool_bytes={}, calls=[])


@dataclass
class World:
    """The claim manager, the writer and the store as the flow sees them; a permissive store that
    counts every commit a writer makes, so that the flow's own discipline is what is checked."""

    live: str | None = None  # the live claim of the unit
    dispatches: int = 0
    commits: list[str] = field(default_factory=list)  # the claim of each commit a writer made
    after_commit: int = 0  # writers dispatched while the unit was committed
    turns: dict[str, flow.UnitOutcome] = field(default_factory=dict)  # the turn ledger: once per claim
    records: dict[str, int] = field(default_factory=dict)  # RecordTurn carried out, per claim

    def committed_by(self) -> str | None:
        return self.commits[0] if self.commits else None

    def carry_out(self, claim: str, command: flow.Command, data: st.DataObject) -> flow.Event:
        """The command's effect and its reply."""
        match command:
            case flow.BeginDispatch(step=step):
                if self.live != claim:
                    return flow.Refused(step=step, code=DELEGATION_NOT_FOUND)
                if self.dispatches >= LIMIT:
                    return flow.Refused(step=step, code=DISPATCH_LIMIT)
                self.dispatches += 1
                return flow.DispatchGranted(step=step, dispatch=self.dispatches)
            case flow.ReadEvidence(step=step):
                return flow.EvidenceRead(step=step, evidence=("gap",))
            case flow.RenderPack(step=step):
                if data.draw(PACKS, label="pack") == 0:
                    return flow.Refused(step=step, code=PACK_ERROR, missing_blocks=("unit",))
                return flow.PackRendered(step=step, text="[[unit]]", context_sha256="sha")
            case flow.RunWriter(step=step, run_id=run_id):
                if self.live != claim:  # CTX-14
                    return flow.Refused(step=step, code=flow.UNIT_NOT_CLAIMED)
                if self.committed_by() is not None:
                    self.after_commit += 1
                kind = data.draw(RUNS, label="run")
                if kind == "commits":
                    self.commits.append(claim)
                    return flow.WriterFinished(step=step, result=result(run_id, True))
                reason = {"fails": "empty-output", "refused": refusal_reason("no-letters"),
                          "window": WINDOW_EXCEEDED}[kind]
                return flow.WriterFinished(step=step, result=result(run_id, False, reason))
            case flow.CheckLanded(step=step):
                return flow.Landed(step=step, landed=self.committed_by() == claim)
            case flow.Verify(step=step):
                ok = self.committed_by() == claim
                return flow.Verified(step=step, ok=ok, failure=None if ok else "not-committed")
            case flow.Settle(step=step):
                if self.committed_by() == claim:
                    return flow.Settled(step=step, landed=True)
                if self.live == claim:
                    self.live = None  # the claim goes back to prepared
                return flow.Settled(step=step, landed=False)
            case flow.RecordTurn(step=step, outcome=outcome):
                self.records[claim] = self.records.get(claim, 0) + 1
                self.turns.setdefault(claim, outcome)
                if self.live == claim:
                    self.live = None  # accounted: committed, or given back (DRV-4)
                return flow.TurnRecorded(step=step)
        raise AssertionError(f"no reply for {command!r}")


def run_flow(world: World, spec: flow.FlowSpec, data: st.DataObject, advance: Advance,
             resume: bool = False, calm: bool = False) -> flow.Done | None:
    """One flow of a claim to its end; None when its process was restarted in the middle."""
    state, commands = flow.resume(spec) if resume else flow.start(spec)
    delivered: list[flow.Event] = []
    records = 0
    for _ in range(200):
        waiting = [c for c in commands if not isinstance(c, flow.EmitVerificationFailed)]
        done = [c for c in waiting if isinstance(c, flow.Done)]
        if done:
            assert waiting == done == [done[-1]], f"commands beside the end: {commands}"
            for late in delivered:  # nothing after the end, whatever comes in
                assert advance(state, late) == (state, [])
            return done[0]
        assert len(waiting) == 1, f"one command awaits a reply at a time: {commands}"
        command = waiting[0]
        records += isinstance(command, flow.RecordTurn)
        assert records <= 1, "a flow records its turn once"
        action = data.draw(CALM if calm else ACTIONS, label="action")
        if action == "restart":  # the process dies; the command may have been carried out
            if data.draw(st.booleans(), label="done before the kill"):
                world.carry_out(spec.claim_id, command, data)
            return None
        if action == "stale" and delivered:  # a reply to an earlier command comes in (again)
            late = delivered[data.draw(st.integers(0, len(delivered) - 1), label="stale")]
            moved, extra = advance(state, late)
            if extra:  # whatever the flow makes of it is carried out, as the actor would
                state, commands = moved, extra
                continue
        if action in ("timeout", "lost"):  # no reply in time; "lost": the command did happen
            if action == "lost":
                world.carry_out(spec.claim_id, command, data)
            event: flow.Event = flow.Unavailable(step=command.step, code="bus-unavailable")
        else:
            event = world.carry_out(spec.claim_id, command, data)
        state, commands = advance(state, event)
        delivered.append(event)
        if action == "twice":  # the same reply delivered again
            moved, extra = advance(state, event)
            if extra:
                state, commands = moved, extra
    raise AssertionError("the flow did not end")


def run_unit(data: st.DataObject, advance: Advance = flow.advance) -> World:
    """Claims of one unit, one after the other, until it is committed and its turn recorded; a
    restarted or unsettled flow is settled again first (REL-7) — as the driver's next step does."""
    world = World()
    for n in range(1, CLAIMS + 1):
        claim = f"claim-{n}"
        world.live, world.dispatches = claim, 0
        first = data.draw(FIRST, label="first dispatch")
        if first is not None:
            world.dispatches = 1
        spec = flow.FlowSpec(novel_id="n-1", unit_id="u-1", claim_id=claim, shape=data.draw(SHAPES, label="shape"),
                             detector=data.draw(st.booleans(), label="det"), nonce=f"n{n}", first_dispatch=first)
        done = run_flow(world, spec, data, advance)
        attempt = 0
        while done is None or done.result not in ("recorded", "released"):
            assert attempt < 4, f"claim {claim} never settled"
            # the novel's next step settles it; the outage is over by the last attempt
            done = run_flow(world, spec, data, advance, resume=True, calm=attempt == 3)
            attempt += 1
        if world.committed_by() is not None and claim in world.turns:
            break
    check(world)
    return world


def check(world: World) -> None:
    assert len(world.commits) <= 1, f"the unit was committed {len(world.commits)} times: {world.commits}"
    assert world.after_commit == 0, "a writer was dispatched after the unit's commit landed"
    by = world.committed_by()
    for claim, outcome in world.turns.items():
        assert outcome.ok == (claim == by), f"claim {claim} recorded as {outcome} (commit by {by})"
    if by is not None:
        assert by in world.turns and world.turns[by].ok, "the landed commit has no committed turn"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_order_of_replies_timeouts_redeliveries_and_restarts_commits_once_and_records_once(
        data: st.DataObject) -> None:
    """HOUSE-7 / REL-1 / REL-2 / REL-7 / VER-1: one commit per unit, one committed turn per commit,
    no failed turn for a claim whose commit landed, nothing after the end."""
    run_unit(data)


def careless_advance(state: flow.FlowState, event: flow.Event) -> flow.Step:
    """A flow that takes any dispatch grant as a new one, a redelivered one too."""
    if isinstance(event, flow.DispatchGranted) and state.phase != "done":
        event = msgspec.structs.replace(event, step=state.step)
        return flow.advance(msgspec.structs.replace(state, phase="dispatch"), event)
    return flow.advance(state, event)


class Script:
    """Draws from a script, label by label (the rest: the first choice), standing in for
    hypothesis's data in a scenario written out by hand."""

    def __init__(self, **script: list[object]) -> None:
        self.script = {label: list(values) for label, values in script.items()}

    def draw(self, strategy: st.SearchStrategy[object], label: str) -> object:
        values = self.script.get(label)
        if values:
            return values.pop(0)
        return {"first dispatch": None, "shape": "W2", "det": False, "pack": 1, "run": "commits",
                "action": "reply", "done before the kill": False, "stale": 0}[label]


def test_the_check_catches_a_flow_that_commits_twice_on_a_redelivered_reply() -> None:
    """HOUSE-7: the property can fail. The same scenario — claim, dispatch, pack, a run that
    commits, then the first dispatch grant delivered again — holds with the flow, and a flow that
    takes any grant as a new one dispatches a second writer, which commits the unit twice."""
    def scenario() -> Script:
        return Script(action=["reply", "reply", "reply", "stale"])

    world = run_unit(scenario(), flow.advance)  # type: ignore[arg-type]
    assert world.commits == ["claim-1"] and world.turns["claim-1"].ok
    with pytest.raises(AssertionError, match="committed 2 times"):
        run_unit(scenario(), careless_advance)  # type: ignore[arg-type]


def test_a_w1_refusal_after_its_repair_turn_fails_the_turn_without_a_new_dispatch() -> None:
    """QUAL-3 / MODEL-5: a refused or window-exceeded run whose commit did not land ends the
    turn as failed with that reason; a plain failure is dispatched again (RUN-4)."""
    spec = flow.FlowSpec(novel_id="n", unit_id="u", claim_id="c", shape="W1", detector=False, nonce="x",
                         first_dispatch=1)
    for reason, again in ((refusal_reason("no-letters"), False), (WINDOW_EXCEEDED, False), ("empty-output", True)):
        state, (pack,) = flow.start(spec)
        assert isinstance(pack, flow.RenderPack)
        state, (run,) = flow.advance(state, flow.PackRendered(step=pack.step, text="p", context_sha256=None))
        assert isinstance(run, flow.RunWriter) and run.run_id == "run-x-1"
        state, (landed,) = flow.advance(state, flow.WriterFinished(step=run.step, result=result(run.run_id, False,
                                                                                                  reason)))
        assert isinstance(landed, flow.CheckLanded)
        state, (nxt,) = flow.advance(state, flow.Landed(step=landed.step, landed=False))
        if again:
            assert isinstance(nxt, flow.BeginDispatch)
        else:
            assert isinstance(nxt, flow.RecordTurn) and nxt.outcome.reason == reason and not nxt.outcome.ok


def test_a_pack_error_records_a_failed_turn_naming_the_missing_blocks() -> None:
    """PACK-4: no writer starts on a broken pack."""
    spec = flow.FlowSpec(novel_id="n", unit_id="u", claim_id="c", shape="W2", detector=False, nonce="x",
                         first_dispatch=1)
    state, (pack,) = flow.start(spec)
    state, (record,) = flow.advance(state, flow.Refused(step=pack.step, code=PACK_ERROR, missing_blocks=("unit",)))
    assert isinstance(record, flow.RecordTurn)
    assert (record.outcome.ok, record.outcome.reason, record.outcome.missing_blocks) == (False, PACK_ERROR, ("unit",))


def test_a_fresh_writer_after_a_run_gets_the_detectors_evidence() -> None:
    """ROLE-2: with the detector on, the second dispatch's pack carries what the detector found
    missing; the first one's reads nothing."""
    spec = flow.FlowSpec(novel_id="n", unit_id="u", claim_id="c", shape="W2", detector=True, nonce="x",
                         first_dispatch=1)
    state, (pack,) = flow.start(spec)
    assert isinstance(pack, flow.RenderPack) and pack.evidence == ()
    state, (run,) = flow.advance(state, flow.PackRendered(step=pack.step, text="p", context_sha256=None))
    assert isinstance(run, flow.RunWriter)
    state, (landed,) = flow.advance(state, flow.WriterFinished(step=run.step, result=result(run.run_id, False,
                                                                                              "detector:gap")))
    state, (dispatch,) = flow.advance(state, flow.Landed(step=landed.step, landed=False))
    state, (read,) = flow.advance(state, flow.DispatchGranted(step=dispatch.step, dispatch=2))
    assert isinstance(read, flow.ReadEvidence)
    state, (pack2,) = flow.advance(state, flow.EvidenceRead(step=read.step, evidence=("gap-1",)))
    assert isinstance(pack2, flow.RenderPack) and pack2.evidence == ("gap-1",)
