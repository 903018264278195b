"""Writer run loops (RUN-2..6): a fresh writer per dispatch unless a session is continued.

The writer-runner actor owns NATS, the database and the claim manager; it injects them here as
async callables (`read_tool`, `commit`). These loops decide only what goes to the model, what a
tool call may do, and when a dispatch has succeeded or failed — always with a recorded reason,
never silently degraded (RUN-4).

Every model call is measured as the service built it (USE-1): raw input characters and their
four-way split — pack, new tool results, re-sent history, prose echo — which add up exactly.

One job per module: ``_records`` (what a run records and returns), ``_metering`` (per-call
usage, the tool definitions' tokens), ``_window`` (MODEL-5 window fitting), ``_w1`` and ``_w2``
(the two loops); this ``__init__`` re-exports the public names.
"""

from __future__ import annotations

from novelbus.writers.runner._metering import (
    call_usage,
    input_text,
    known_tool_definition_tokens,
    run_tool_tokens,
    split_input,
    tool_definition_tokens,
    truncate_args,
)
from novelbus.writers.runner._records import (
    CallUsage,
    ExecutionPolicy,
    InputSplit,
    RunOutcome,
    ToolRecord,
    ToolStart,
    ToolStartedFn,
    executed_call,
)
from novelbus.writers.runner._w1 import (
    W1_INSTRUCTION,
    W1_REFUSED,
    W1_REPAIR,
    DraftCommit,
    DraftRefusal,
    run_w1,
)
from novelbus.writers.runner._w2 import W2_INSTRUCTION, forced_commit_tools, forced_tools, run_w2
from novelbus.writers.runner._window import (
    MIN_OUTPUT_TOKENS,
    WINDOW_MARGIN_TOKENS,
    PromptMark,
    WindowError,
    expected_output_tokens,
    fit_output_tokens,
    projected_tokens,
    prompt_mark,
    reported_prompt_tokens,
    request_tokens,
)

__all__ = [
    "CallUsage",
    "DraftCommit",
    "DraftRefusal",
    "ExecutionPolicy",
    "InputSplit",
    "MIN_OUTPUT_TOKENS",
    "PromptMark",
    "RunOutcome",
    "ToolRecord",
    "ToolStart",
    "ToolStartedFn",
    "W1_INSTRUCTION",
    "W1_REFUSED",
    "W1_REPAIR",
    "W2_INSTRUCTION",
    "WINDOW_MARGIN_TOKENS",
    "WindowError",
    "expected_output_tokens",
    "fit_output_tokens",
    "call_usage",
    "executed_call",
    "forced_commit_tools",
    "forced_tools",
    "input_text",
    "known_tool_definition_tokens",
    "projected_tokens",
    "prompt_mark",
    "reported_prompt_tokens",
    "request_tokens",
    "run_tool_tokens",
    "run_w1",
    "run_w2",
    "split_input",
    "tool_definition_tokens",
    "truncate_args",
]
