"""JetStream streams and consumers: durable work notices, replayable events, dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import os

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError

from novelbus.messages.subjects import Subjects

WORK_MAX_DELIVER = 5  # bounded redelivery; then the notice goes to the dead-letter subject
WORK_ACK_WAIT_S = 20.0  # the driver sends in-progress acks (every 5 s) while a unit runs; a dead
# driver's notice is redelivered after this
DUPLICATE_WINDOW_S = 120.0  # Nats-Msg-Id de-duplication window
NO_PEERS_FOR_PLACEMENT = 10005  # JetStream: a replica's peer is not (yet) online
PLACEMENT_WAIT_S = 15.0  # a cluster still forming gets this long to bring its peers online
DAY = 86_400.0
ENV_EVENTS_MAX_AGE_DAYS = "NOVELBUS_EVENTS_MAX_AGE_DAYS"


def events_max_age_days() -> int:
    """Days the events and dead-letter streams keep a message (OPS-11): the deployment's
    ``NOVELBUS_EVENTS_MAX_AGE_DAYS`` (1..3650), else 30. Applied at every start (the streams are
    updated), so a monitor starting late replays this far back."""
    value = os.environ.get(ENV_EVENTS_MAX_AGE_DAYS, "30")
    if not value.isdigit() or not 1 <= int(value) <= 3650:
        raise ValueError(f"{ENV_EVENTS_MAX_AGE_DAYS} must be a whole number of days, 1..3650, got {value!r}")
    return int(value)


def _stream_configs(s: Subjects) -> list[StreamConfig]:
    keep = events_max_age_days() * DAY
    return [
        StreamConfig(name=s.work_stream, subjects=[s.work_all], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, max_age=7 * DAY, duplicate_window=DUPLICATE_WINDOW_S),
        StreamConfig(name=s.events_stream, subjects=[s.events_all], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, max_age=keep, duplicate_window=DUPLICATE_WINDOW_S),
        StreamConfig(name=s.dlq_stream, subjects=[s.dead_letter_all], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, max_age=keep),
    ]


def stream_replicas() -> int:
    """Replicas of new streams: ``NOVELBUS_STREAM_REPLICAS`` (3 on a 3-node cluster, REL-10), else 1."""
    value = os.environ.get("NOVELBUS_STREAM_REPLICAS", "1")
    if not value.isdigit() or not 1 <= int(value) <= 5:
        raise ValueError(f"NOVELBUS_STREAM_REPLICAS must be 1..5, got {value!r}")
    return int(value)


async def ensure_streams(js: JetStreamContext, s: Subjects, *, replicas: int | None = None) -> None:
    """Create or update the streams; safe to call from many processes at once. An existing
    stream keeps its replica count (a process started without the setting never shrinks it)."""
    for cfg in _stream_configs(s):
        cfg.num_replicas = replicas or stream_replicas()
        await _add_or_update(js, cfg)


async def _add_or_update(js: JetStreamContext, cfg: StreamConfig) -> None:
    """Add the stream, else update it; a cluster whose peers are not all online yet (a node just
    started, REL-10) is waited for up to PLACEMENT_WAIT_S instead of failing the start."""
    waited = 0.0
    while True:
        try:
            await js.add_stream(cfg)
            return
        except BadRequestError as e:
            if e.err_code == NO_PEERS_FOR_PLACEMENT and waited < PLACEMENT_WAIT_S:
                await asyncio.sleep(0.5)
                waited += 0.5
                continue
            with contextlib.suppress(Exception):
                cfg.num_replicas = (await js.stream_info(cfg.name or "")).config.num_replicas
            await js.update_stream(cfg)
            return


def driver_consumer_config(s: Subjects) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name="driver", filter_subject=s.work_all, ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL, ack_wait=WORK_ACK_WAIT_S,
        max_deliver=WORK_MAX_DELIVER + 1, max_ack_pending=1000,
    )
