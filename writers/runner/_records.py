"""What a writer run records and returns: tool calls, per-call usage and its input split (USE-1),
the run's outcome (RUN-4), and the session policy (RUN-5). Data only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from novelbus.novel.body import CommitBody
from novelbus.writers.provider import Usage
from novelbus.writers.sessions import SessionStore


class ToolStart(msgspec.Struct, frozen=True):
    """A tool call about to run (RUN-6 `tool.started`): never prose, never a token."""

    seq: int
    tool: str
    args_truncated: str
    refused: bool  # outside the allow-list: it will not run (RUN-3)


ToolStartedFn = Callable[[ToolStart], Awaitable[None]]


class ToolRecord(msgspec.Struct, frozen=True):
    seq: int
    tool: str
    args_truncated: str  # JSON text ≤ 500 chars; paragraphs replaced by their count, never prose
    is_error: bool
    result_bytes: int
    error_code: str | None = None  # "tool-not-allowed", "tool-contract", or the commit's code
    refused: bool = False  # RUN-3 / REL-5: outside the allow-list, refused by the host
    forced: bool = False  # MODEL-3: the host forced this call by name (tool_choice)


def executed_call(
    seq: int, tool: str, args_truncated: str, code: str | None, content: str, forced: bool
) -> ToolRecord:
    """The record of a call that ran (or was refused): `code` its error code, `content` the
    result text the model was given; RUN-3 / REL-5: a refusal is recorded as one."""
    return ToolRecord(
        seq=seq,
        tool=tool,
        args_truncated=args_truncated,
        is_error=code is not None,
        result_bytes=len(content.encode()),
        error_code=code,
        refused=code == "tool-not-allowed",
        forced=forced,
    )


class InputSplit(msgspec.Struct, frozen=True):
    """Where one call's raw input characters came from (USE-1); the four add up to the total."""

    pack_chars: int  # the system pack and the run instruction
    tool_result_chars: int  # tool results new since the previous call
    history_chars: int  # this run's earlier assistant and tool messages, re-sent
    prose_echo_chars: int  # commit paragraphs re-sent inside earlier assistant messages

    @property
    def total(self) -> int:
        return self.pack_chars + self.tool_result_chars + self.history_chars + self.prose_echo_chars


class CallUsage(msgspec.Struct, frozen=True):
    """One model call as the service built it (USE-1); provider tokens when reported."""

    input_chars: int  # raw: every message content and tool-call argument character sent
    output_chars: int  # text plus tool-call names and arguments received
    tool_result_chars: int  # new tool results (one part of the split)
    pack_chars: int
    history_chars: int
    prose_echo_chars: int
    est_input_tokens: int  # novel.text.estimate_tokens over the same input
    usage: Usage | None  # None when the provider reports none (USE-2: fail-open)
    forced: bool = False  # MODEL-3: made with a forced tool_choice
    tool_definition_tokens: int = 0  # MODEL-6: estimated tokens of the tool definitions sent

    @property
    def input_split(self) -> InputSplit:
        return InputSplit(
            pack_chars=self.pack_chars,
            tool_result_chars=self.tool_result_chars,
            history_chars=self.history_chars,
            prose_echo_chars=self.prose_echo_chars,
        )


class RunOutcome(msgspec.Struct, frozen=True):
    ok: bool
    reason: str | None  # None when ok; else a RUN-4 failure reason
    draft: CommitBody | None = None  # W1: the draft to commit; W2: the committed body
    receipt: dict[str, Any] | None = None  # W2: the commit receipt from the claim manager
    tool_calls: list[ToolRecord] = []
    usage: list[CallUsage] = []
    output_chars: int = 0  # everything the model produced over the run: text + tool-call arguments
    detail: str | None = None  # a short, prose-free explanation of the failure
    session_continued: bool = False  # RUN-5: this run re-sent a stored session's history
    # MODEL-3: offered tools under auto, the model made no allowed call of its own in this run
    auto_declined: bool = False

    @property
    def dependencies(self) -> list[dict[str, Any]]:
        """The dependency manifest `[{seq, tool, args, isError}]` of RUN-6."""
        return [
            {"seq": r.seq, "tool": r.tool, "args": r.args_truncated, "isError": r.is_error}
            | ({"forced": True} if r.forced else {})
            for r in self.tool_calls
        ]


@dataclass(frozen=True)
class ExecutionPolicy:
    """RUN-5: a writer session to continue, named by id and store together or not at all.

    With a session, a W2 run that revises the same chapter continues the stored conversation
    and a rewrite starts a new one (`writers.sessions.resume_history`); the run's conversation
    is saved back under the same id. Without one, every run is a fresh writer.
    """

    session_id: str | None = None
    session_store: SessionStore | None = None

    def __post_init__(self) -> None:
        if (self.session_id is None) != (self.session_store is None):
            raise ValueError("session_id and session_store must be given together or not at all")

    @property
    def reuses_session(self) -> bool:
        return self.session_id is not None
