"""A deployment's named model endpoints (SERVE-1..4), and the provider every call goes through.

`NOVELBUS_ENDPOINTS_FILE` names a JSON file:

    {"endpoints": [{"name": "gpu-1", "model": "smollm2", "baseUrl": "http://127.0.0.1:8080/v1",
                    "maxInFlight": 4, "requestsPerMinute": 600, "tokensPerMinute": 400000,
                    "server": "llama.cpp", "cacheAffinity": true,
                    "prices": {"input": 0.15, "cachedInput": 0.075, "output": 0.6}}]}

`make_provider` wraps the provider a spec names in an `EndpointProvider` when an endpoint fits
it (`openai:<model>`: the endpoint of that model; `local`: the endpoint named `local`). Every
call then takes a slot of its endpoint from the process's `SlotLimiter` — the deployment's
PostgreSQL limiter (`store.limiter.PgLimiter`, installed by the actor runtime when it connects),
else one of this process only — and gives it back when the reply is in, so the limit holds for
every role (writer, detector, extractor, judge) whichever process calls. SERVE-4: a 429 or a
5xx gives the slot back at once and asks again after the retry policy's delay or the server's
`Retry-After` (which holds back the whole endpoint); past the policy the endpoint is marked
down, the health probe (`actors.serving`) pauses its novels `model-unavailable` and resumes
them when it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec

from novelbus.novel import serving
from novelbus.novel.bill import Prices
from novelbus.novel.retry import RetryPolicy
from novelbus.writers.local_provider import LocalProvider
from novelbus.writers.provider import ChatMessage, ModelProvider, ModelReply, ProviderError

ENV_ENDPOINTS_FILE = "NOVELBUS_ENDPOINTS_FILE"
ENV_CACHE_AFFINITY = "NOVELBUS_CACHE_AFFINITY"
LOCAL_ENDPOINT = "local"  # the endpoint entry that sets `--model local`'s limits
ServerKind = Literal["openai", "llama.cpp", "vllm", "other"]
RETRYABLE = ("provider-unavailable", "provider-rate-limited")


class Backoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """SERVE-4: how a call that met a 429, a 5xx or no answer asks again (HOUSE-3's policy)."""

    initial_interval_s: float = 0.5
    maximum_interval_s: float = 8.0
    maximum_attempts: int = 6

    def policy(self) -> RetryPolicy:
        return RetryPolicy(initial_interval_s=self.initial_interval_s, maximum_interval_s=self.maximum_interval_s,
                           maximum_attempts=self.maximum_attempts)


class Endpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """One model endpoint of the deployment (SERVE-1). `maxInFlight`: requests at once, across
    every process (match a llama.cpp server's `--parallel`); per-minute limits: None is none.
    `server` decides the affinity fields sent (SERVE-3): llama.cpp gets `id_slot` (the slot
    number the limiter granted) and `cache_prompt`; openai, llama.cpp and vllm get
    `prompt_cache_key`; every kind gets the affinity header. `affinityHoldMs`: a slot a chapter
    gives back is kept that long for the chapter's next call. `apiKeyEnv`: the variable holding
    its key (else NOVELBUS_MODEL_API_KEY / OPENAI_API_KEY)."""

    name: str
    model: str
    base_url: str | None = None
    max_in_flight: int = 4
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    prices: Prices | None = None
    server: ServerKind = "openai"
    cache_affinity: bool = True
    affinity_hold_ms: int = 0
    api_key_env: str | None = None
    retry: Backoff = msgspec.field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if not self.name.strip() or not self.model.strip():
            raise ValueError("an endpoint needs a name and a model")
        if self.max_in_flight < 1:
            raise ValueError(f"endpoint {self.name!r}: maxInFlight must be at least 1, got {self.max_in_flight}")
        for label, value in (("requestsPerMinute", self.requests_per_minute),
                             ("tokensPerMinute", self.tokens_per_minute)):
            if value is not None and value < 1:
                raise ValueError(f"endpoint {self.name!r}: {label} must be at least 1 or null, got {value}")
        if not 0 <= self.affinity_hold_ms <= 10_000:
            raise ValueError(f"endpoint {self.name!r}: affinityHoldMs must be from 0 to 10000, got {self.affinity_hold_ms}")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {self.name!r}: baseUrl must be an http(s) URL")


class EndpointsFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    endpoints: list[Endpoint]


def load_endpoints(path: Path) -> list[Endpoint]:
    """The endpoints of a file; a bad file raises ProviderError naming the file and what is wrong."""
    where = f"{ENV_ENDPOINTS_FILE} must be a readable endpoints file (JSON); {path}"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ProviderError("provider-config", f"{where}: cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        eps = msgspec.json.decode(raw, type=EndpointsFile).endpoints
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ProviderError("provider-config", f"{where}: {e}") from None
    names = [e.name for e in eps]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ProviderError("provider-config", f"{where}: endpoint names must differ: {', '.join(twice)} twice")
    return eps


def endpoints_from_env(env: Mapping[str, str] | None = None) -> list[Endpoint]:
    """The deployment's endpoints (NOVELBUS_ENDPOINTS_FILE); none when it is unset."""
    raw = ((os.environ if env is None else env).get(ENV_ENDPOINTS_FILE) or "").strip()
    return load_endpoints(Path(raw)) if raw else []


def affinity_from_env(env: Mapping[str, str] | None = None) -> bool:
    """SERVE-3: NOVELBUS_CACHE_AFFINITY — `off` turns cache affinity off on every endpoint
    (benchmarks compare with it); `on` or unset: each endpoint's `cacheAffinity`."""
    raw = ((os.environ if env is None else env).get(ENV_CACHE_AFFINITY) or "").strip().lower()
    if raw in ("", "on"):
        return True
    if raw == "off":
        return False
    raise ValueError(f"{ENV_CACHE_AFFINITY} must be on or off, got {raw!r}")


def endpoint_for(spec: str, endpoints: list[Endpoint]) -> Endpoint | None:
    """The endpoint that serves a provider spec: `local` → the one named `local`; `openai:<m>`
    → the one of model `m` (the one named `m` when several serve it)."""
    kind, _, model = spec.strip().partition(":")
    if kind == LOCAL_ENDPOINT:
        return next((e for e in endpoints if e.name == LOCAL_ENDPOINT), None)
    if kind != "openai":
        return None
    model = model.strip()
    named = [e for e in endpoints if e.name == model]
    return named[0] if named else next((e for e in endpoints if e.model == model), None)


# --- the limiter ------------------------------------------------------------------------------


class HeldSlot(Protocol):
    slot: int
    down: bool
    tokens: int


class SlotLimiter(Protocol):
    """SERVE-1: where a call takes its endpoint's slot (`store.limiter.PgLimiter`)."""

    def slot(self, endpoint: str, *, capacity: int, group: str, asked: float | None = None,
             requests_per_minute: int | None = None, tokens_per_minute: int | None = None,
             affinity: bool = True, reserve_s: float = 0.0) -> contextlib.AbstractAsyncContextManager[HeldSlot]: ...

    async def hold(self, endpoint: str, seconds: float) -> None: ...
    async def mark_down(self, endpoint: str) -> None: ...
    async def mark_up(self, endpoint: str) -> None: ...


@dataclass
class _LocalHeld:
    slot: int
    down: bool = False
    tokens: int = 0


@dataclass
class ProcessLimiter:
    """The limiter of a process with no database (a probe, a one-off command): the same grant
    decision (novel.serving.grant) over this process's calls only; it keeps no freed slot for a
    chapter (`reserve_s` is the deployment limiter's)."""

    _holders: dict[str, dict[int, str]] = field(default_factory=dict)
    _last: dict[str, dict[int, tuple[str, float]]] = field(default_factory=dict)
    _held_until: dict[str, float] = field(default_factory=dict)
    _waiting: dict[str, list[serving.Waiter]] = field(default_factory=dict)
    _changed: asyncio.Condition | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _tickets: int = 0

    @contextlib.asynccontextmanager
    async def slot(self, endpoint: str, *, capacity: int, group: str, asked: float | None = None,
                   requests_per_minute: int | None = None, tokens_per_minute: int | None = None,
                   affinity: bool = True, reserve_s: float = 0.0) -> AsyncIterator[HeldSlot]:
        if self._changed is None or self._loop is not asyncio.get_running_loop():
            self._changed, self._loop = asyncio.Condition(), asyncio.get_running_loop()
        self._tickets += 1
        me = serving.Waiter(ticket=self._tickets, asked=asked if asked is not None else time.time(), group=group)
        waiting = self._waiting.setdefault(endpoint, [])
        holders = self._holders.setdefault(endpoint, {})
        last = self._last.setdefault(endpoint, {})
        waiting.append(me)
        number: int | None = None
        try:
            async with self._changed:
                while number is None:
                    slots = [serving.Slot(number=n, holder_group=holders.get(n), last_group=last.get(n, ("", 0.0))[0]
                                          or None, last_used=last.get(n, ("", 0.0))[1]) for n in range(capacity)]
                    budget = serving.Budget(capacity=capacity,
                                            held=self._held_until.get(endpoint, 0.0) > time.monotonic())
                    for g in serving.grant([me], slots, budget, affinity=affinity):
                        number = g.slot
                    if number is None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), 0.25)
                holders[number] = group
                last[number] = (group, time.monotonic())
        finally:
            waiting.remove(me)
        try:
            yield _LocalHeld(slot=number)
        finally:
            holders.pop(number, None)
            async with self._changed:
                self._changed.notify_all()

    async def hold(self, endpoint: str, seconds: float) -> None:
        self._held_until[endpoint] = max(self._held_until.get(endpoint, 0.0), time.monotonic() + seconds)

    async def mark_down(self, endpoint: str) -> None:
        return None

    async def mark_up(self, endpoint: str) -> None:
        return None


_installed: list[SlotLimiter] = []
_process_limiter = ProcessLimiter()


@contextlib.contextmanager
def installed(limiter: SlotLimiter) -> Any:
    """SERVE-1: make `limiter` the one this process's endpoint providers take slots from (the
    actor runtime installs the deployment's PostgreSQL limiter while it is connected)."""
    _installed.append(limiter)
    try:
        yield limiter
    finally:
        _installed.remove(limiter)


def current_limiter() -> SlotLimiter:
    return _installed[-1] if _installed else _process_limiter


# --- the provider -----------------------------------------------------------------------------


def affinity_fields(endpoint: Endpoint, key: str, slot: int) -> tuple[dict[str, Any], dict[str, str]]:
    """SERVE-3: the request fields and headers that let a server reuse a chapter's cached prefix."""
    body: dict[str, Any] = {}
    if endpoint.server in ("openai", "llama.cpp", "vllm"):
        body["prompt_cache_key"] = key
    if endpoint.server == "llama.cpp":
        body["id_slot"] = slot  # this slot number is ours alone while we hold it (SERVE-1)
        body["cache_prompt"] = True
    return body, {serving.AFFINITY_HEADER: key}


def unwrapped(provider: Any) -> Any:
    """The provider an `EndpointProvider` limits (any other provider as it is), for a caller that
    asks what kind of server it talks to (the probe, the window discovery)."""
    return provider.inner if isinstance(provider, EndpointProvider) else provider


class EndpointProvider:
    """A provider whose every call takes a slot of its endpoint (SERVE-1..4)."""

    def __init__(self, inner: ModelProvider, endpoint: Endpoint, *, limiter: SlotLimiter | None = None,
                 affinity: bool | None = None) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.name = inner.name
        self.label = inner.label
        self.context_window = getattr(inner, "context_window", None)
        self.structured_mode = getattr(inner, "structured_mode", None)
        self.prices = endpoint.prices
        self._limiter = limiter
        self.affinity = endpoint.cache_affinity and (affinity_from_env() if affinity is None else affinity)
        self.policy = endpoint.retry.policy()
        # Seconds this process's calls waited for a slot (a benchmark's queueing, apart from the model's time)
        self.slot_wait_s = 0.0

    @property
    def limiter(self) -> SlotLimiter:
        return self._limiter if self._limiter is not None else current_limiter()

    def __getattr__(self, name: str) -> Any:  # discover_context_window, measure_tool_tokens, aclose, …
        return getattr(self.inner, name)

    async def _target(self) -> Any:
        """The provider that takes the affinity fields: the embedded server's client for `local`."""
        return await self.inner.start() if isinstance(self.inner, LocalProvider) else self.inner

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        ep, limiter = self.endpoint, self.limiter
        key = serving.affinity_key(messages)
        asked = time.time()
        retry = 0
        while True:
            failure: ProviderError
            asking = time.perf_counter()
            async with limiter.slot(ep.name, capacity=ep.max_in_flight, group=key, asked=asked,
                                    requests_per_minute=ep.requests_per_minute,
                                    tokens_per_minute=ep.tokens_per_minute, affinity=self.affinity,
                                    reserve_s=ep.affinity_hold_ms / 1000) as held:
                self.slot_wait_s += time.perf_counter() - asking
                extra: dict[str, Any] = {}
                if self.affinity:
                    body, headers = affinity_fields(ep, key, held.slot)
                    extra = {"extra_body": body, "extra_headers": headers}
                try:
                    reply: ModelReply = await (await self._target()).complete(
                        messages, tools, max_output_tokens=max_output_tokens, **options, **extra)
                except ProviderError as e:
                    if e.code not in RETRYABLE:
                        raise
                    failure = e
                else:
                    usage = reply.usage
                    held.tokens = (usage.input_tokens or 0) + (usage.output_tokens or 0) if usage else 0
                    if held.down:
                        await limiter.mark_up(ep.name)
                    return reply
            # the slot is given back: the wait below holds none (SERVE-4)
            retry += 1
            if failure.retry_after_s is not None:
                await limiter.hold(ep.name, failure.retry_after_s)  # the whole endpoint waits
            if held.down or not self.policy.allows(retry):
                if failure.code == "provider-unavailable":
                    await limiter.mark_down(ep.name)
                raise failure
            await asyncio.sleep(serving.next_ask_delay_s(self.policy, retry, retry_after=failure.retry_after_s,
                                                         jitter=random.random()))
