"""OPS-11: the deployment's events retention is the events and dead-letter streams' max age,
applied at every start (an existing stream is updated), and a malformed value is refused."""

from __future__ import annotations

import pytest

from novelbus.bus.client import connect
from novelbus.bus.streams import DAY, ENV_EVENTS_MAX_AGE_DAYS, ensure_streams, events_max_age_days
from novelbus.messages.subjects import Subjects


async def test_events_max_age_days_sets_the_events_and_dead_letter_streams_max_age_at_each_start(
        nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-11: 30 days by default; with NOVELBUS_EVENTS_MAX_AGE_DAYS=90 a later start updates both
    streams to 90 days and leaves the work stream's week alone."""
    s = Subjects(namespace)
    nc = await connect(nats_url, name="retention-test")
    try:
        js = nc.jetstream()
        monkeypatch.delenv(ENV_EVENTS_MAX_AGE_DAYS, raising=False)
        await ensure_streams(js, s)
        assert (await js.stream_info(s.events_stream)).config.max_age == 30 * DAY
        monkeypatch.setenv(ENV_EVENTS_MAX_AGE_DAYS, "90")
        await ensure_streams(js, s)
        ages = {name: (await js.stream_info(name)).config.max_age
                for name in (s.events_stream, s.dlq_stream, s.work_stream)}
        assert ages == {s.events_stream: 90 * DAY, s.dlq_stream: 90 * DAY, s.work_stream: 7 * DAY}, ages
        for name in (s.work_stream, s.events_stream, s.dlq_stream):
            await js.delete_stream(name)
    finally:
        await nc.drain()


@pytest.mark.parametrize("value", ["0", "forever", "3651", "-1"])
def test_a_malformed_events_max_age_is_refused_naming_the_setting(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-11: not a whole number of days in 1..3650 raises naming the variable and the value."""
    monkeypatch.setenv(ENV_EVENTS_MAX_AGE_DAYS, value)
    with pytest.raises(ValueError, match=f"{ENV_EVENTS_MAX_AGE_DAYS}.*{value!r}"):
        events_max_age_days()
