"""SERVE-1..4 at the provider: the endpoints file and its errors, the affinity fields a call
carries (and none with affinity off), cached tokens from llama.cpp's `timings.cache_n`, and a
429 with `Retry-After` that holds the whole endpoint back without a slot held meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.store import limiter
from novelbus.store.limiter import PgLimiter
from novelbus.writers.endpoints import (
    EndpointProvider,
    ProcessLimiter,
    affinity_from_env,
    endpoint_for,
    load_endpoints,
    unwrapped,
)
from novelbus.writers.factory import make_provider
from novelbus.writers.openai_provider import OpenAIProvider
from novelbus.writers.provider import ProviderError
from tests.writers.chat_server import ChatServer, completion, json_response

PACK = "[[protocol]]\nWrite.\n[[chapter]]\nOne\n\n[[scene]]\nthe scene\n"
MESSAGES = [{"role": "system", "content": PACK}, {"role": "user", "content": "write"}]


def write_endpoints(tmp_path: Path, *endpoints: dict[str, Any]) -> Path:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"endpoints": list(endpoints)}))
    return path


def provider(chat: ChatServer, tmp_path: Path, *, affinity: str = "on", **fields: Any) -> EndpointProvider:
    file = write_endpoints(tmp_path, {"name": "gpu", "model": "m", "baseUrl": chat.base_url, **fields})
    made = make_provider("openai:m", env={"NOVELBUS_ENDPOINTS_FILE": str(file), "NOVELBUS_CACHE_AFFINITY": affinity})
    assert isinstance(made, EndpointProvider)
    return made


@pytest.mark.parametrize(("body", "said"), [
    ('{"endpoints": [{"name": "a", "model": "m", "maxInFlight": 0}]}', "maxInFlight must be at least 1"),
    ('{"endpoints": [{"name": "a", "model": "m", "slots": 2}]}', "unknown field `slots`"),
    ('{"endpoints": [{"name": "a", "model": "m"}, {"name": "a", "model": "n"}]}', "names must differ: a twice"),
    ('{"endpoints": [{"name": "a", "model": "m", "baseUrl": "ftp://x"}]}', "baseUrl must be an http(s) URL"),
    ('{"endpoints": [{"name": "a", "model": "m", "prices": {"input": 1}}]}', "missing required field `output`"),
    ("not json", "malformed"),
])
def test_a_bad_endpoints_file_is_refused_naming_the_file_and_what_is_wrong(body: str, said: str,
                                                                              tmp_path: Path) -> None:
    """SERVE-1"""
    path = tmp_path / "endpoints.json"
    path.write_text(body)
    with pytest.raises(ProviderError) as caught:
        load_endpoints(path)
    assert caught.value.code == "provider-config"
    assert str(path) in caught.value.message and said.lower() in caught.value.message.lower()


def test_a_spec_picks_its_endpoint_by_model_or_name_and_local_by_its_name(tmp_path: Path) -> None:
    """SERVE-1: openai:<model> → the endpoint of that model; local → the endpoint named local;
    the prices are the bill's struct."""
    eps = load_endpoints(write_endpoints(
        tmp_path, {"name": "gpu", "model": "qwen", "maxInFlight": 3, "prices": {"input": 0.1, "output": 0.4}},
        {"name": "local", "model": "smollm2", "maxInFlight": 4, "server": "llama.cpp"}))
    gpu = endpoint_for("openai:qwen", eps)
    assert gpu is not None and gpu.max_in_flight == 3 and gpu.prices is not None and gpu.prices.output == 0.4
    assert endpoint_for("openai:gpu", eps) == gpu and endpoint_for("openai:other", eps) is None
    local = endpoint_for("local", eps)
    assert local is not None and local.server == "llama.cpp" and endpoint_for("offline", eps) is None
    assert affinity_from_env({}) and not affinity_from_env({"NOVELBUS_CACHE_AFFINITY": "off"})
    with pytest.raises(ValueError, match="NOVELBUS_CACHE_AFFINITY must be on or off"):
        affinity_from_env({"NOVELBUS_CACHE_AFFINITY": "maybe"})


async def test_a_llama_cpp_call_carries_its_slot_and_key_and_reports_cache_n(tmp_path: Path) -> None:
    """SERVE-3: id_slot (the slot granted), cache_prompt, prompt_cache_key and the routing header;
    llama.cpp's `timings.cache_n` becomes the usage's cached tokens."""
    status, headers, body = completion(content="ok", usage={"prompt_tokens": 50, "completion_tokens": 5})
    with_timings = json.loads(body) | {"timings": {"cache_n": 42, "prompt_n": 8}}
    async with ChatServer([json_response(with_timings)]) as server:
        p = provider(server, tmp_path, server="llama.cpp", maxInFlight=2)
        p._limiter = ProcessLimiter()
        reply = await p.complete(MESSAGES, None, max_output_tokens=16)
    assert reply.usage is not None and reply.usage.cached_tokens == 42
    assert isinstance(unwrapped(p), OpenAIProvider) and unwrapped(p.inner) is p.inner  # what the probe asks
    sent = server.requests[0]
    assert sent["id_slot"] == 0 and sent["cache_prompt"] is True and len(sent["prompt_cache_key"]) == 32
    assert server.headers[0]["x-novelbus-affinity"] == sent["prompt_cache_key"]


async def test_the_time_a_call_waits_for_a_slot_is_counted_apart(tmp_path: Path) -> None:
    """SERVE-1: the endpoint's one slot is taken for 0.3 s; the call waits for it, and that wait
    (queueing, not the model's time) is what `slot_wait_s` adds up."""
    async with ChatServer([completion(content="ok")]) as server:
        p = provider(server, tmp_path, maxInFlight=1)
        lim = p._limiter = ProcessLimiter()
        taken, go = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with lim.slot("gpu", capacity=1, group="other"):
                taken.set()
                await go.wait()

        holder = asyncio.ensure_future(hold())
        await taken.wait()
        asyncio.get_running_loop().call_later(0.3, go.set)  # the other call's model time
        await p.complete(MESSAGES, None, max_output_tokens=16)
        await holder
    assert 0.25 <= p.slot_wait_s < 5, p.slot_wait_s


async def test_with_affinity_off_a_call_carries_no_key_no_slot_and_no_header(tmp_path: Path) -> None:
    """SERVE-3: NOVELBUS_CACHE_AFFINITY=off (the switch `bench serve` compares with)."""
    async with ChatServer([completion(content="ok")]) as server:
        p = provider(server, tmp_path, affinity="off", server="llama.cpp")
        p._limiter = ProcessLimiter()
        await p.complete(MESSAGES, None, max_output_tokens=16)
    sent = server.requests[0]
    assert not {"id_slot", "cache_prompt", "prompt_cache_key"} & set(sent)
    assert "x-novelbus-affinity" not in server.headers[0]


async def test_a_429_with_retry_after_holds_the_endpoint_and_no_slot_is_held_while_waiting(
        tmp_path: Path, new_database: Any) -> None:
    """SERVE-4: the first answer is 429 `Retry-After: 1`; the call gives its slot back, the
    endpoint is held for a second (for every process: the hold is in the store), and the call
    is answered after it. While it waits, no slot of the endpoint is taken."""
    dsn = await new_database()
    pool: asyncpg.Pool = await store.connect(dsn, max_size=4)
    refused = json_response({"error": {"message": "slow down"}}, 429, {"retry-after": "1"})
    try:
        await store.migrate(pool)
        async with ChatServer([refused, completion(content="ok")]) as server:
            p = provider(server, tmp_path, retry={"initialIntervalS": 0.05, "maximumAttempts": 3})
            p._limiter = PgLimiter(pool, lease_s=5.0)
            started = time.monotonic()
            call = asyncio.ensure_future(p.complete(MESSAGES, None, max_output_tokens=16))
            deadline = time.monotonic() + 10
            while not any(s.endpoint == "gpu" and s.held_until is not None
                          for s in await limiter.endpoint_states(pool)):
                assert time.monotonic() < deadline and not call.done(), "the 429 held nothing back"
                await asyncio.sleep(0.01)  # a look at the store again
            held_while_waiting = await limiter.slots_held(pool, "gpu")
            still_waiting = not call.done()
            reply = await call
            waited = time.monotonic() - started
    finally:
        await pool.close()
    assert reply.text == "ok" and len(server.requests) == 2
    assert waited >= 1.0, waited
    assert held_while_waiting == 0 and still_waiting
