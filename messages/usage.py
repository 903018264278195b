"""Usage sampler commands (USE-1..3)."""

from messages.base import Message
from messages.runs import CallSample


class RecordTurn(Message, tag="usage.turn"):
    novel_id: str
    unit_id: str
    mode: str
    turn: int
    provider: str
    calls: list[CallSample]
    tool_bytes: dict[str, int]
    writer_output_chars: int
    committed: bool


class TurnRecorded(Message, tag="usage.recorded"):
    novel_id: str
    turn: int
    input_chars: int


UsageRequest = RecordTurn
