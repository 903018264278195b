"""Writer runner commands (RUN-1..6)."""

from typing import Literal

import msgspec

from novelbus.messages.base import Message


class Sampling(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """QUAL-4: config.model.sampling of the novel, sent on every writer call of a run (None: the
    server's default). `max_output_tokens` caps each call's reply."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    max_output_tokens: int | None = None


class RunWriter(Message, tag="runs.run", frozen=True):
    novel_id: str
    unit_id: str
    run_id: str
    delegation_id: str
    instance: str
    shape: Literal["W1", "W2", "inline"]  # inline: the novel's one persistent author session (DRV-2)
    pack_text: str
    dispatch: int
    context_sha256: str | None = None
    # RUN-5: continue the stored writer session of this id when the unit revises the same chapter;
    # `rewrite` starts it afresh. None: a fresh writer that stores nothing.
    session_id: str | None = None
    rewrite: bool = False
    claim_id: str = ""  # REL-7: recorded with the run, so a run its claim outlived can be closed
    # MODEL-5: config.model of the novel (the provider's own window counts too: the smaller wins)
    context_window: int | None = None
    usage_threshold_ratio: float = 0.7
    sampling: Sampling | None = None  # QUAL-4: config.model.sampling (None: nothing set)
    # QUAL-5 / CTX-10: config.rawVault.retentionDays when the novel keeps its raw calls (and the
    # deployment has a raw vault); None: nothing is kept.
    raw_vault_days: int | None = None


class CallSample(Message, tag="runs.call", frozen=True):
    """One model call's measured input (USE-1): the four-way split adds up to input_chars."""

    input_chars: int
    output_chars: int
    history_chars: int
    tool_result_chars: int
    pack_chars: int
    prose_echo_chars: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    est_input_tokens: int = 0
    cache_write_tokens: int | None = None  # reported apart from cached reads where a provider does
    compaction: bool = False  # inline: a host-style compaction call (its input is the whole history)
    forced: bool = False  # MODEL-3: the host forced the commit tool by name on this call
    tool_definition_tokens: int = 0  # MODEL-6: tool definitions sent with this call (tokens)


class WriterResult(Message, tag="runs.finished", frozen=True):
    run_id: str
    unit_id: str
    ok: bool
    reason: str
    provider: str
    output_chars: int
    tool_calls: int
    tool_bytes: dict[str, int]
    calls: list[CallSample]
    model_ms: float = 0.0  # wall time inside provider calls, so benchmarks can subtract model time
    # RUN-6 dependency summary: tool calls in the stored manifest (successful runs only) and where
    # it is kept; 0 and None for a failed run or a run without tool calls.
    dependencies: int = 0
    dependencies_at: str | None = None
    session_continued: bool = False  # RUN-5: the run re-sent a stored session's history


RunsRequest = RunWriter
