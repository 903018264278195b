"""MODEL-1: the embedded model's provider restarts a server that died, but never one it was told
to stop — a bench or actor shutting down (Ctrl-C) must not bring the model back up."""

from __future__ import annotations

import pytest

from novelbus.writers.chat import user_message
from novelbus.writers.local_provider import LocalProvider
from novelbus.writers.provider import ProviderError


class _Server:
    """A stand-in for the embedded llama server's process handle (no model needed here)."""

    model = "m"
    context_window = 2_048
    slots = 1
    api_key = "k"

    def __init__(self) -> None:
        self.starts = 0
        self.up = False

    @property
    def running(self) -> bool:
        return self.up

    async def start(self) -> str:
        self.starts += 1
        self.up = True
        return "http://127.0.0.1:9/v1"

    async def stop(self) -> None:
        self.up = False


async def test_a_closed_local_provider_never_restarts_its_server() -> None:
    """MODEL-1"""
    server = _Server()
    provider = LocalProvider(server)
    await provider.start()
    assert server.starts == 1
    server.up = False  # the server died (e.g. llama.cpp's grammar crash): the next call restarts it
    await provider.start()
    assert server.starts == 2
    await provider.aclose()
    with pytest.raises(ProviderError) as err:
        await provider.complete([user_message("Hi")], None, max_output_tokens=1)
    assert err.value.code == "provider-unavailable" and "stopped" in err.value.message
    assert server.starts == 2 and not server.running
