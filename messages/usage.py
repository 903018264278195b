"""Usage sampler commands (USE-1..3)."""

from novelbus.messages.base import Message
from novelbus.messages.runs import CallSample


class RecordTurn(Message, tag="usage.turn", frozen=True):
    novel_id: str
    unit_id: str
    mode: str  # the mode the unit was claimed in (DRV-3)
    turn: int
    provider: str
    calls: list[CallSample]  # every model call of every dispatch of this turn
    tool_bytes: dict[str, int]
    writer_output_chars: int
    committed: bool
    claim_id: str = ""  # with (novel, unit, turn): a redelivered RecordTurn is counted once
    dispatches: int = 1
    model_ms: float | None = None  # wall time inside provider calls, when the runner measured it


class TurnRecorded(Message, tag="usage.recorded", frozen=True):
    novel_id: str
    turn: int
    input_chars: int
    duplicate: bool = False  # True when this (novel, unit, turn, claim) was already recorded


UsageRequest = RecordTurn
