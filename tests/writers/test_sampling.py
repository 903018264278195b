"""QUAL-4: a novel's sampling settings, the provider's timeout and reply-cap field, and the window
fit's reply reserve — against the in-test chat-completions server (no model, no mocks of it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from novelbus.messages.runs import Sampling
from novelbus.novel.outline import NovelConfig, SamplingConfig, describe_validation_error
from novelbus.writers.factory import (
    make_provider,
    max_tokens_field_from_env,
    model_timeout_from_env,
)
from novelbus.writers.offline import OfflineProvider
from novelbus.writers.openai_provider import OpenAIProvider
from novelbus.writers.provider import ProviderError, complete
from novelbus.writers.runner import (
    MIN_OUTPUT_TOKENS,
    WindowError,
    expected_output_tokens,
    fit_output_tokens,
)
from novelbus.writers.sampling import (
    SampledProvider,
    capped_output_tokens,
    sampling_of,
    sampling_problem,
)
from tests.writers.chat_server import ChatServer, completion, json_response

MESSAGES = [{"role": "user", "content": "write"}]
SAMPLING = Sampling(temperature=0.3, top_p=0.9, seed=11, frequency_penalty=0.5, presence_penalty=-0.5,
                    max_output_tokens=200)


def provider_for(server: ChatServer, **kw: Any) -> OpenAIProvider:
    return OpenAIProvider("test-model", server.base_url, "not-needed", max_retries=0, **kw)


def config_error(sampling: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as err:
        NovelConfig.model_validate({"model": {"sampling": sampling}})
    return describe_validation_error(err.value)


# --- the config block -------------------------------------------------------------------------------


@pytest.mark.parametrize(("sampling", "field"), [
    ({"temperature": 2.5}, "model.sampling.temperature"),
    ({"temperature": -0.1}, "model.sampling.temperature"),
    ({"temperature": "0.5"}, "model.sampling.temperature"),
    ({"topP": 0}, "model.sampling.topP"),
    ({"topP": 1.5}, "model.sampling.topP"),
    ({"seed": True}, "model.sampling.seed"),
    ({"seed": -1}, "model.sampling.seed"),
    ({"seed": 1.5}, "model.sampling.seed"),
    ({"frequencyPenalty": 3}, "model.sampling.frequencyPenalty"),
    ({"presencePenalty": -2.5}, "model.sampling.presencePenalty"),
    ({"maxOutputTokens": 8}, "model.sampling.maxOutputTokens"),
    ({"temperatur": 0.5}, "model.sampling.temperatur"),
])
def test_a_bad_sampling_value_is_refused_naming_its_field(sampling: dict[str, Any], field: str) -> None:
    """QUAL-4: types and ranges are validated; the error names the field (never coerced)."""
    assert config_error(sampling).startswith(f"{field}:")


@given(st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0, 2), "topP": st.floats(0.01, 1), "seed": st.integers(0, 2**32 - 1),
    "frequencyPenalty": st.floats(-2, 2), "presencePenalty": st.floats(-2, 2),
    "maxOutputTokens": st.integers(16, 1_000_000)}))
def test_every_valid_sampling_block_reaches_the_wire_struct_unchanged(block: dict[str, Any]) -> None:
    """QUAL-4: what the novel sets is what a run carries; nothing set is None (the server's default)."""
    cfg = SamplingConfig.model_validate(block)
    wire = sampling_of(cfg)
    if not block:
        assert wire is None
        return
    assert wire is not None
    assert wire.temperature == block.get("temperature") and wire.top_p == block.get("topP")
    assert wire.seed == block.get("seed") and wire.max_output_tokens == block.get("maxOutputTokens")
    assert wire.frequency_penalty == block.get("frequencyPenalty")
    assert wire.presence_penalty == block.get("presencePenalty")


def test_max_output_tokens_lowers_the_reply_cap_and_never_raises_it() -> None:
    """QUAL-4: maxOutputTokens caps each call's reply below the deployment's cap."""
    assert capped_output_tokens(8192, None) == 8192
    assert capped_output_tokens(8192, Sampling(max_output_tokens=300)) == 300
    assert capped_output_tokens(256, Sampling(max_output_tokens=300)) == 256


# --- on the wire ------------------------------------------------------------------------------------


async def test_the_novels_sampling_arrives_in_every_request_and_unset_fields_are_not_sent() -> None:
    """QUAL-4: temperature, top_p, seed and the penalties are sent as set; a provider wrapped for a
    run adds them to each call; without sampling none of them is sent."""
    async with ChatServer([completion(content="a"), completion(content="b"), completion(content="c")]) as s:
        provider = provider_for(s)
        try:
            await SampledProvider(provider, SAMPLING).complete(MESSAGES, None, max_output_tokens=64)
            await complete(provider, MESSAGES, None, max_output_tokens=64, sampling=Sampling(seed=5))
            await complete(provider, MESSAGES, None, max_output_tokens=64)
        finally:
            await provider.aclose()
    first, second, third = s.requests
    assert (first["temperature"], first["top_p"], first["seed"]) == (0.3, 0.9, 11)
    assert (first["frequency_penalty"], first["presence_penalty"]) == (0.5, -0.5)
    assert second["seed"] == 5 and "temperature" not in second and "top_p" not in second
    assert not {"temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"} & set(third)


async def test_the_offline_writer_accepts_sampling_and_ignores_it() -> None:
    """QUAL-4: the offline provider takes the settings and writes exactly what it writes without them."""
    offline = OfflineProvider()
    plain = await offline.complete(MESSAGES, None, max_output_tokens=64)
    sampled = await SampledProvider(OfflineProvider(), SAMPLING).complete(MESSAGES, None, max_output_tokens=64)
    assert sampled.text == plain.text


# --- max_tokens / max_completion_tokens ---------------------------------------------------------------

REASONING_400 = json_response({"error": {
    "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
               "Use 'max_completion_tokens' instead.",
    "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}, 400)


async def test_a_server_refusing_max_tokens_gets_max_completion_tokens_and_keeps_it() -> None:
    """QUAL-4: detected — a 400 naming max_tokens is retried once with max_completion_tokens, which
    the provider then sends from the first try."""
    async with ChatServer([REASONING_400, completion(content="ok"), completion(content="again")]) as s:
        provider = provider_for(s)
        try:
            reply = await provider.complete(MESSAGES, None, max_output_tokens=123)
            again = await provider.complete(MESSAGES, None, max_output_tokens=45)
        finally:
            await provider.aclose()
    assert (reply.text, again.text) == ("ok", "again")
    assert s.requests[0]["max_tokens"] == 123 and "max_completion_tokens" not in s.requests[0]
    assert s.requests[1]["max_completion_tokens"] == 123 and "max_tokens" not in s.requests[1]
    assert s.requests[2]["max_completion_tokens"] == 45 and len(s.requests) == 3


async def test_a_configured_field_is_used_as_is_and_another_400_is_not_retried() -> None:
    """QUAL-4: configured — NOVELBUS_MODEL_MAX_TOKENS_FIELD=max_tokens sends max_tokens and a 400
    naming it is the server's error, not retried; a 400 about something else is never retried."""
    env = {"NOVELBUS_MODEL_BASE_URL": "http://127.0.0.1:9/v1"}
    configured = make_provider("openai:m", env={**env, "NOVELBUS_MODEL_MAX_TOKENS_FIELD": "max_completion_tokens"})
    assert isinstance(configured, OpenAIProvider) and configured.max_tokens_field == "max_completion_tokens"
    await configured.aclose()
    other_400 = json_response({"error": {"message": "bad temperature", "param": "temperature"}}, 400)
    for script, kw in (([REASONING_400], {"max_tokens_field": "max_tokens"}), ([other_400], {})):
        async with ChatServer(list(script)) as s:
            provider = provider_for(s, **kw)
            try:
                with pytest.raises(ProviderError) as err:
                    await provider.complete(MESSAGES, None, max_output_tokens=10)
            finally:
                await provider.aclose()
        assert err.value.code == "provider-bad-reply" and len(s.requests) == 1


def test_the_timeout_and_field_settings_are_read_and_refused_naming_themselves() -> None:
    """QUAL-4: NOVELBUS_MODEL_TIMEOUT_S reaches the client; bad values are refused naming the setting."""
    env = {"NOVELBUS_MODEL_BASE_URL": "http://127.0.0.1:9/v1", "NOVELBUS_MODEL_TIMEOUT_S": "300"}
    provider = make_provider("openai:m", env=env)
    assert isinstance(provider, OpenAIProvider) and provider._client.timeout == 300.0
    default = make_provider("openai:m", env={"NOVELBUS_MODEL_BASE_URL": env["NOVELBUS_MODEL_BASE_URL"]})
    assert isinstance(default, OpenAIProvider) and default._client.timeout == 120.0
    assert model_timeout_from_env({"NOVELBUS_MODEL_TIMEOUT_S": "2.5"}) == 2.5
    for bad in ("0", "-3", "soon", "nan", "inf", "100000"):
        with pytest.raises(ProviderError, match="NOVELBUS_MODEL_TIMEOUT_S"):
            model_timeout_from_env({"NOVELBUS_MODEL_TIMEOUT_S": bad})
    assert max_tokens_field_from_env({"NOVELBUS_MODEL_MAX_TOKENS_FIELD": "auto"}) is None
    with pytest.raises(ProviderError, match="NOVELBUS_MODEL_MAX_TOKENS_FIELD"):
        max_tokens_field_from_env({"NOVELBUS_MODEL_MAX_TOKENS_FIELD": "max_output_tokens"})


# --- refused at creation --------------------------------------------------------------------------


def refusing(field: str) -> Any:
    def step(request: dict[str, Any]) -> Any:
        if field in request:
            return json_response({"error": {"message": f"unsupported {field}", "param": field}}, 400)
        return completion(content="word")
    return step


async def test_a_server_refusing_a_sampling_field_is_named_at_creation() -> None:
    """QUAL-4: the probe request carries the settings; the field the server refuses is named."""
    cfg = SamplingConfig(temperature=0.4, seed=9)
    async with ChatServer([], responder=refusing("seed")) as s:
        provider = provider_for(s)
        try:
            problem = await sampling_problem(provider, cfg)
            accepted = await sampling_problem(provider, SamplingConfig(temperature=0.4))
            nothing = await sampling_problem(provider, SamplingConfig())
        finally:
            await provider.aclose()
    assert problem is not None and "config.model.sampling.seed" in problem
    assert "temperature" not in problem and "HTTP 400" in problem
    assert accepted is None and nothing is None
    assert s.requests[0]["seed"] == 9 and s.requests[0]["temperature"] == 0.4
    assert len(s.requests) == 4  # together, then each field alone, then the accepted one


# --- the window fit's reply reserve ---------------------------------------------------------------


def test_the_reserve_is_the_units_target_max_in_tokens_in_the_storys_script() -> None:
    """QUAL-4: Latin text a quarter token a character, CJK one, plus the reply's envelope."""
    assert expected_output_tokens(None) == MIN_OUTPUT_TOKENS
    REPLY_ENVELOPE_TOKENS = expected_output_tokens(0)  # noqa: N806  the draft's keys and notes alone
    assert REPLY_ENVELOPE_TOKENS > MIN_OUTPUT_TOKENS
    assert expected_output_tokens(2000, "An English story.") == 500 + REPLY_ENVELOPE_TOKENS
    assert expected_output_tokens(2000, "灯塔守夜人的故事") == 2000 + REPLY_ENVELOPE_TOKENS
    mixed = expected_output_tokens(2000, "灯塔 lamp")
    assert 500 + REPLY_ENVELOPE_TOKENS < mixed < 2000 + REPLY_ENVELOPE_TOKENS


def test_a_window_without_room_for_the_unit_is_refused_before_the_call() -> None:
    """QUAL-4: a request leaving less than the unit's expected output is never sent; the reserve is
    never more than the call may ask for."""
    messages = [{"role": "user", "content": "x" * 4000}]  # about 1,000 + 64 prompt tokens
    assert fit_output_tokens(messages, None, 4096, 4000, reserve=600) == 4000 - 1064
    with pytest.raises(WindowError, match="at least 2,000 needed"):
        fit_output_tokens(messages, None, 4096, 3000, reserve=2000)
    # a reserve above the call's cap asks only for the cap
    assert fit_output_tokens(messages, None, 500, 1600, reserve=2000) == 500
    with pytest.raises(WindowError):
        fit_output_tokens(messages, None, 500, 1500, reserve=2000)


def test_the_sampling_block_round_trips_through_json() -> None:
    """QUAL-4: the wire struct encodes camelCase like every message."""
    import msgspec

    text = msgspec.json.encode(SAMPLING)
    assert json.loads(text)["topP"] == 0.9
    assert msgspec.json.decode(text, type=Sampling) == SAMPLING


def test_a_redispatch_draws_with_the_next_seed_and_the_first_dispatch_with_the_novels() -> None:
    """QUAL-4: the same pack with the same seed would replay the reply that failed."""
    from novelbus.messages.runs import Sampling
    from novelbus.writers.sampling import for_dispatch

    base = Sampling(temperature=0.7, seed=7, max_output_tokens=64)
    assert for_dispatch(base, 1) is base
    assert [for_dispatch(base, d).seed for d in (2, 3)] == [8, 9]  # type: ignore[union-attr]
    assert for_dispatch(base, 3) == Sampling(temperature=0.7, seed=9, max_output_tokens=64)
    assert for_dispatch(Sampling(seed=4_294_967_295), 2).seed == 0  # type: ignore[union-attr]
    unseeded = Sampling(temperature=0.2)
    assert for_dispatch(unseeded, 5) is unseeded and for_dispatch(None, 2) is None
