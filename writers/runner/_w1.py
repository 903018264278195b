"""The W1 run (RUN-2, MODEL-2): no tools, one JSON draft, one repair round."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from novelbus.novel.body import CommitBody, body_shape
from novelbus.novel.commitcheck import BodyError, parse_draft_lenient
from novelbus.novel.quality import refused_code
from novelbus.writers.chat import assistant_message, system_message, user_message
from novelbus.writers.provider import ModelProvider, ProviderError, complete, context_window
from novelbus.writers.runner._metering import Meter, split_input
from novelbus.writers.runner._records import RunOutcome
from novelbus.writers.runner._window import (
    PromptMark,
    WindowError,
    expected_output_tokens,
    fit_output_tokens,
    projected_tokens,
    prompt_mark,
)
from novelbus.writers.structured import unit_target_max

# QUAL-1: the field names from the body's one definition; no placeholder to copy as prose.
W1_INSTRUCTION = (
    "Write the unit described in [[unit]] now. Reply with one JSON object only, no Markdown "
    f"fence, with the fields the protocol lists: {body_shape()}."
)


W1_REPAIR = (
    "That reply is not a valid draft: {error}. Reply again with the corrected JSON object only."
)

# QUAL-3: the one repair turn after the verifier refused a draft: the check's code and what to
# change (figures and advice only; never the draft's prose).
W1_REFUSED = (
    "That draft was refused by the {code} check: {advice} Write the unit again and reply with the "
    "whole corrected JSON object only."
)



class DraftRefusal(NamedTuple):
    """Why a parsed draft did not become canon: the failure reason, what to change (figures and
    advice only), and whether it earns the one repair turn (QUAL-3: the content gate's and the
    detector's refusals do; a body rule or the claim refusing fails the dispatch, RUN-4)."""

    reason: str
    advice: str
    repair: bool = True


# HOUSE-6: the orchestrator's commit of a parsed draft through the claim manager, whose one check
# of the candidate answers: None (committed) or the refusal.
DraftCommit = Callable[[CommitBody], Awaitable[DraftRefusal | None]]


async def run_w1(
    provider: ModelProvider,
    pack_text: str,
    *,
    max_output_tokens: int,
    mechanism: str = "prompt",
    window: int | None = None,
    commit: DraftCommit | None = None,
) -> RunOutcome:
    """RUN-2: no tools; the reply must be a commit-schema JSON draft, else the dispatch fails.

    MODEL-2: the draft is requested through `mechanism` (P6's choice: json_schema,
    json_object+schema, json_object or prompt), parsed leniently, validated strictly; an invalid
    draft gets one repair round with the validation error before the dispatch fails.

    HOUSE-6 / QUAL-3: a valid draft is committed (`commit`, through the claim manager, which has
    it checked once); a refusal that earns a repair gets one repair turn naming the check and
    what to change; refused again, or refused without a repair, the run fails with the refusal's
    reason (`quality:<code>`, `verify:guard`, `commit:<code>`). Without `commit` the parsed
    draft ends the run (the loop's own tests).
    """
    from novelbus.writers.structured import draft_schema, pack_commit_ids, response_format

    window = window if window is not None else context_window(provider)
    messages = [system_message(pack_text), user_message(W1_INSTRUCTION)]
    target_max = unit_target_max(pack_text)
    fmt = response_format(mechanism, draft_schema(target_max=target_max, shown_commits=pack_commit_ids(pack_text)))
    reserve = expected_output_tokens(target_max, pack_text)  # QUAL-4: room for the whole unit
    meter = Meter()

    def fail(reason: str, detail: str | None = None) -> RunOutcome:
        return RunOutcome(
            ok=False,
            reason=reason,
            usage=meter.calls,
            output_chars=meter.output_chars,
            detail=detail,
        )

    mark: PromptMark | None = None
    repaired = refused = False
    while True:
        split = split_input(messages, preamble=2, new_from=2)
        try:
            max_tokens = fit_output_tokens(
                messages,
                None,
                max_output_tokens,
                window,
                prompt_tokens=projected_tokens(messages, None, mark),
                reserve=reserve,
            )
        except WindowError as e:
            return fail("window-exceeded", str(e))
        try:
            reply = await complete(
                provider, messages, None, max_output_tokens=max_tokens, response_format=fmt
            )
        except ProviderError as e:
            meter.record(messages, split, None)
            return fail(f"provider-error:{e.code}", e.message)
        meter.record(messages, split, reply)
        mark = prompt_mark(messages, None, reply)
        if reply.stop_reason != "completed":
            return fail(f"stop-reason:{reply.stop_reason}")
        if not (reply.text or "").strip():
            return fail("empty-output")
        try:
            draft = parse_draft_lenient(reply.text or "")
        except BodyError as e:
            if repaired:
                return fail("invalid-draft", str(e))
            repaired = True
            messages = [
                *messages,
                assistant_message(reply),
                user_message(W1_REPAIR.format(error=str(e)[:400])),
            ]
            continue
        refusal = await commit(draft) if commit is not None else None
        if refusal is not None:
            reason, advice, repair = refusal
            if refused or not repair:
                return fail(reason, advice)
            refused = True
            messages = [
                *messages,
                assistant_message(reply),
                user_message(W1_REFUSED.format(code=refused_code(reason) or reason, advice=advice)),
            ]
            continue
        return RunOutcome(
            ok=True, reason=None, draft=draft, usage=meter.calls, output_chars=meter.output_chars
        )
