"""OPS-6: a model call is counted once, however many wrappers a run puts around its provider,
with the tokens its endpoint reported, by role and endpoint; a failed call by its error code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from novelbus.writers import metrics
from novelbus.writers.provider import ModelReply, ProviderError, Usage, complete
from novelbus.writers.timing import TimedProvider


class Endpoint:
    """A provider that answers from a list: a reply, or an error to raise."""

    name = "test-endpoint"
    label = "test endpoint (no model)"
    endpoint = "http://127.0.0.1:1/v1#slot-group"

    def __init__(self, *answers: ModelReply | ProviderError) -> None:
        self.answers = list(answers)

    async def complete(self, messages: list[dict[str, Any]], tools: Any, *, max_output_tokens: int,
                       **options: Any) -> ModelReply:
        answer = self.answers.pop(0)
        if isinstance(answer, ProviderError):
            raise answer
        return answer


def _value(counter: Any, *labels: str) -> float:
    return float(counter.labels(*labels)._value.get())


@pytest.fixture
def role() -> Iterator[str]:
    metrics.set_role_source(lambda: "writer-test")
    yield "writer-test"
    metrics.set_role_source(lambda: "other")


async def test_a_call_through_wrappers_counts_once_with_its_tokens(role: str) -> None:
    """OPS-6"""
    inner = Endpoint(ModelReply(text="x", usage=Usage(input_tokens=120, cached_tokens=100, output_tokens=7)))
    ep = inner.endpoint
    calls, inp, cached, out = (_value(metrics.MODEL_CALLS, role, ep, "ok"),
                               *(_value(metrics.MODEL_TOKENS, role, ep, k) for k in ("input", "cached", "output")))
    await complete(TimedProvider(TimedProvider(inner)), [{"role": "user", "content": "hi"}], None,
                   max_output_tokens=8)
    assert _value(metrics.MODEL_CALLS, role, ep, "ok") == calls + 1
    assert _value(metrics.MODEL_TOKENS, role, ep, "input") == inp + 120
    assert _value(metrics.MODEL_TOKENS, role, ep, "cached") == cached + 100
    assert _value(metrics.MODEL_TOKENS, role, ep, "output") == out + 7


async def test_a_failed_call_counts_under_its_error_code(role: str) -> None:
    """OPS-6"""
    inner = Endpoint(ProviderError("provider-rate-limited", "slow down"))
    before = _value(metrics.MODEL_CALLS, role, inner.endpoint, "provider-rate-limited")
    with pytest.raises(ProviderError):
        await complete(inner, [{"role": "user", "content": "hi"}], None, max_output_tokens=8)
    assert _value(metrics.MODEL_CALLS, role, inner.endpoint, "provider-rate-limited") == before + 1


def test_endpoint_slots_are_gauges_a_serving_provider_sets() -> None:
    """OPS-6: SERVE's slots in use and waiting, per endpoint."""
    metrics.endpoint_slots("e-1", in_use=3, waiting=2)
    assert metrics.ENDPOINT_SLOTS_IN_USE.labels("e-1")._value.get() == 3
    assert metrics.ENDPOINT_SLOTS_WAITING.labels("e-1")._value.get() == 2


def test_an_endpoint_label_names_provider_model_and_host_but_never_credentials() -> None:
    """OPS-6"""

    class Remote:
        name, label, model, host = "openai", "remote", "m-1", "user:secret@127.0.0.1:8080"

    assert metrics.endpoint_of(TimedProvider(Remote())) == "openai:m-1@127.0.0.1:8080"  # type: ignore[arg-type]
