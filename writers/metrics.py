"""What the model calls cost, as Prometheus metrics (OPS-6): calls and tokens by role and endpoint,
and the model endpoints' slots.

Counted once per call at the outermost `writers.provider.complete` (the wrappers of one run —
timing, sampling, recording — pass one call through; only the first counts). A metric update is
a dictionary look-up and an increment under a lock: no I/O on a unit's path. The process's
`/metrics` endpoint (`infra.health`) serves them with the rest.

The role is the actor making the call. This room sits below the actors, so it cannot ask them;
the process that runs actors installs the source once (`set_role_source`), else "other".
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge

MODEL_CALLS = Counter("novelbus_model_calls", "Model calls, by the role (actor) making them, the endpoint and "
                      "the outcome (ok, or the provider error code).", ["role", "endpoint", "outcome"])
MODEL_TOKENS = Counter("novelbus_model_tokens", "Tokens the endpoint reported (input, cached input, output), by "
                       "role and endpoint; a call without usage adds nothing.", ["role", "endpoint", "kind"])
ENDPOINT_SLOTS_IN_USE = Gauge("novelbus_endpoint_slots_in_use", "Model-endpoint slots serving a call now.",
                              ["endpoint"])
ENDPOINT_SLOTS_WAITING = Gauge("novelbus_endpoint_slots_waiting", "Calls waiting for a free slot of the endpoint.",
                               ["endpoint"])

_role_source: Callable[[], str] = lambda: "other"  # noqa: E731 - replaced by set_role_source
_counting: contextvars.ContextVar[bool] = contextvars.ContextVar("novelbus_model_call_counted", default=False)


def set_role_source(source: Callable[[], str]) -> None:
    """Name the role of a call from the caller's context (the actor serving it)."""
    global _role_source
    _role_source = source


def endpoint_of(provider: Any) -> str:
    """The endpoint label of a provider: its `endpoint` when it has one, else `name[:model][@host]`; through
    the wrappers of a run (`ProviderWrapper.inner`), the provider they wrap."""
    for _ in range(16):  # a wrapper chain is a few deep; never loop on a cycle
        inner = getattr(provider, "inner", None)
        if inner is None:
            break
        provider = inner
    endpoint = getattr(provider, "endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        return endpoint
    label = str(getattr(provider, "name", "unknown"))
    model, host = getattr(provider, "model", None), getattr(provider, "host", None)
    if isinstance(model, str) and model:
        label += f":{model}"
    if isinstance(host, str) and host:
        label += f"@{host.rpartition('@')[2]}"  # never a URL's credentials
    return label


def enter_call() -> contextvars.Token[bool] | None:
    """Begin a model call; a token when this call is the one to count (the outermost), else None."""
    if _counting.get():
        return None
    return _counting.set(True)


def leave_call(token: contextvars.Token[bool] | None, provider: Any, usage: Any, outcome: str) -> None:
    """End a call begun with `enter_call`; count it (and its usage, when reported) if it was the one."""
    if token is None:
        return
    _counting.reset(token)
    role, endpoint = _role_source(), endpoint_of(provider)
    MODEL_CALLS.labels(role, endpoint, outcome).inc()
    if usage is None:
        return
    for kind, value in (("input", usage.input_tokens), ("cached", usage.cached_tokens),
                        ("output", usage.output_tokens)):
        if value:
            MODEL_TOKENS.labels(role, endpoint, kind).inc(value)


def endpoint_slots(endpoint: str, *, in_use: int, waiting: int) -> None:
    """SERVE: a provider that shares an endpoint's slots reports them here whenever they change."""
    ENDPOINT_SLOTS_IN_USE.labels(endpoint).set(in_use)
    ENDPOINT_SLOTS_WAITING.labels(endpoint).set(waiting)
