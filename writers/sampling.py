"""QUAL-4: a novel's sampling settings on every writer call, and whether a server accepts them.

`config.model.sampling` (temperature, topP, seed, frequencyPenalty, presencePenalty,
maxOutputTokens) travels with each run (`RunWriter.sampling`); the writer runner wraps its
provider for that run in a `SampledProvider`, so W1, W2 and the inline session send it on every
call — repair turns, forced commits and compaction included — without each loop passing it on.
The offline writer accepts and ignores it.

`sampling_problem` asks the server once, at creation, with the novel's settings: a server that
refuses a field is named there, not in a failed unit.
"""

from __future__ import annotations

from typing import Any

import msgspec

from novelbus.messages.runs import Sampling
from novelbus.novel.outline import SamplingConfig
from novelbus.writers.chat import user_message
from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ProviderError,
    ProviderWrapper,
    complete,
)

# The config's camelCase names beside the wire struct's fields, for errors naming the field.
CONFIG_FIELDS = {
    "temperature": "temperature",
    "topP": "top_p",
    "seed": "seed",
    "frequencyPenalty": "frequency_penalty",
    "presencePenalty": "presence_penalty",
    "maxOutputTokens": "max_output_tokens",
}


def sampling_of(config: SamplingConfig) -> Sampling | None:
    """The wire form of `config.model.sampling`; None when nothing is set."""
    if not config.is_set():
        return None
    return Sampling(**{attr: getattr(config, name) for name, attr in CONFIG_FIELDS.items()})


SEED_SPACE = 1 << 32  # seeds are 0–4,294,967,295 (config.model.sampling.seed)


def for_dispatch(sampling: Sampling | None, dispatch: int) -> Sampling | None:
    """QUAL-4: the sampling of a unit's `dispatch`-th writer run. A fixed seed draws the first run
    as set and each re-dispatch with the next seed: the same pack with the same seed would replay
    the reply that failed. Still one seed per (novel seed, dispatch): a rerun is reproducible."""
    if sampling is None or sampling.seed is None or dispatch <= 1:
        return sampling
    return msgspec.structs.replace(sampling, seed=(sampling.seed + dispatch - 1) % SEED_SPACE)


def capped_output_tokens(max_output_tokens: int, sampling: Sampling | None) -> int:
    """A call's reply cap: the deployment's, lowered to the novel's maxOutputTokens when set."""
    if sampling is None or sampling.max_output_tokens is None:
        return max_output_tokens
    return min(max_output_tokens, sampling.max_output_tokens)


class SampledProvider(ProviderWrapper):
    """Wraps a provider for ONE run and adds the novel's sampling settings to every call."""

    def __init__(self, provider: ModelProvider, sampling: Sampling | None) -> None:
        super().__init__(provider)
        self.sampling = sampling

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        **options: Any,
    ) -> ModelReply:
        if self.sampling is not None:
            options["sampling"] = self.sampling
        return await super().complete(messages, tools, max_output_tokens=max_output_tokens, **options)


PROBE_MESSAGES: list[ChatMessage] = [user_message("Say one word.")]


async def _accepted(provider: ModelProvider, sampling: Sampling) -> ProviderError | None:
    try:
        await complete(provider, PROBE_MESSAGES, None, max_output_tokens=4, sampling=sampling)
    except ProviderError as e:
        return e
    return None


async def sampling_problem(provider: ModelProvider, config: SamplingConfig) -> str | None:
    """Why the model server refuses the novel's sampling settings, naming the field, or None when
    it answers a request that carries them (nothing set: no request). A server that fails for
    another reason (down, credentials) is reported as such."""
    sampling = sampling_of(config)
    if sampling is None:
        return None
    error = await _accepted(provider, sampling)
    if error is None:
        return None
    if error.code != "provider-bad-reply":
        return error.message
    refused = []
    for name, attr in CONFIG_FIELDS.items():  # which field: each one alone
        value = getattr(sampling, attr)
        if value is None or attr == "max_output_tokens":
            continue
        if await _accepted(provider, Sampling(**{attr: value})) is not None:
            refused.append(f"config.model.sampling.{name}")
    fields = ", ".join(refused) if refused else "config.model.sampling (the fields together)"
    return (f"the writer model refused {fields}: {error.message}; remove or change it "
            "(`novelbus novel config --set` on a running novel)")
