"""QUAL-4 with a REAL model: the same seed twice gives the same reply.

SmolLM2-135M-Instruct on the embedded llama.cpp `llama-server` (`--model local`), sampling at a
temperature where an unseeded reply would vary, through the `SampledProvider` the writer runner
wraps every run's provider in (W1, W2 and inline calls all go through it; the in-test server's
tests in `tests/writers/test_sampling.py` hold that every call of every shape carries it).

The server reuses its KV cache for the prefix a request shares with the previous one, and logits
computed from a cached prefix differ from a fresh evaluation in the last bits — enough to change
a token drawn at temperature 1.0. So each call starts from the same server state (one short
request first), as two runs of a novel on a fresh server do.
"""

from __future__ import annotations

import pytest

from novelbus.messages.runs import Sampling
from novelbus.writers.provider import complete
from novelbus.writers.sampling import SampledProvider
from tests.e2e.test_local_model import _need_local_model

pytestmark = [pytest.mark.timeout(300), pytest.mark.local_model]


PROMPT = [{"role": "user", "content": "Write the opening paragraph of a story about a lighthouse keeper."}]


async def test_the_same_seed_twice_gives_the_same_reply_and_another_seed_another() -> None:
    """QUAL-4: seed and temperature reach the embedded server through the run's sampled
    provider: two calls with seed 42 at temperature 1.0 return the same text, word for word;
    seed 43 another."""
    _need_local_model()
    from novelbus.infra.llama import open_local_server
    from novelbus.writers.local_provider import LocalProvider

    provider = LocalProvider(open_local_server(None, None))
    replies: list[str] = []
    try:
        for seed in (42, 42, 43):
            await complete(provider, [{"role": "user", "content": "Hi"}], None, max_output_tokens=1)
            run = SampledProvider(provider, Sampling(temperature=1.0, top_p=0.95, seed=seed))
            reply = await run.complete(PROMPT, None, max_output_tokens=64)
            assert reply.text and reply.usage and reply.usage.output_tokens, reply.stop_reason
            replies.append(reply.text)
    finally:
        await provider.aclose()
    assert replies[0] == replies[1]
    assert replies[2] != replies[0]
