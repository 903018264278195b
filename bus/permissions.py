"""Who may publish and subscribe what on NATS (OPS-9, OPS-3, CLM-5), and deploy/nats.conf from it.

One table says which user serves each command subject and which users send it (`SERVES`,
`SENDS`). The rest follows from the subject table (`messages.subjects.Subjects`) and the
consumers the actors bind (`bus.streams`): who publishes work notices and events, and the
JetStream API calls each user makes, on novelbus's three streams only. `grants` turns that into
one allow list per user; `nats_conf` renders the whole configuration file, which
`novelbus deploy nats-config` writes. A command subject the table does not place is refused
here, so a new subject cannot ship without its permission.

Users are kinds of process, not roles: the extractor, the planner and the endpoint probe run in
the driver's process, the detector in the verifier's, the judge in the operator's CLI (`bench
ab`, studies) — they connect as those users.
"""

from __future__ import annotations

from dataclasses import dataclass

from novelbus.bus.consumer import JS_API_PREFIX
from novelbus.bus.streams import driver_consumer_config
from novelbus.messages.subjects import ACTOR_NAMES, Subjects

SERVES: dict[str, str] = {  # command -> the one user that subscribes to it
    "claims": "claims", "claims-instance": "claims", "commit": "claims", "packs": "packer",
    "runs": "writer", "verify": "verifier", "usage": "usage", "steer": "driver",
}
SENDS: dict[str, tuple[str, ...]] = {  # command -> the users that publish requests to it
    "claims": ("driver",),  # a claim per unit
    "claims-instance": ("driver", "claims"),  # CLM-5: grants and releases; forwarding to the holder
    "commit": ("writer",),  # CLM-2: candidates come from the writer runner's runs (W1 and W2) only
    "packs": ("driver",),
    "runs": ("driver",),
    "verify": ("driver", "claims"),  # VER-1 after a commit; QUAL-2 a candidate before it is canon
    "usage": ("driver",),  # USE-1: the turn ledger
    "steer": ("operator",),  # PLAN-1..5: the CLI, the panel, external planners
}
NOTICE_SENDERS = ("driver", "claims", "operator", "scheduler")  # REL-1: claims publishes recoveries
# OPS-11: the operator's restore republishes the ledger's events
EVENT_SENDERS = (*ACTOR_NAMES, "operator")
USERS = (*ACTOR_NAMES, "operator", "scheduler", "monitor")

PURPOSES = {
    "driver": "the driver: pulls work notices, runs each unit's flow, serves steering; the extractor, "
              "planner and endpoint probe run in its process",
    "claims": "the claim manager: claims, delegations and commits (CLM-1..5)",
    "packer": "the pack renderer",
    "writer": "the writer runner: model calls, and the candidates it sends to the claim manager",
    "verifier": "the commit verifier; the detector runs in its process",
    "usage": "the usage sampler",
    "operator": "the CLI and the panel: novels, notices, steering, follow/monitor, status, dlq, "
                "novel delete, backup/restore; no actor's command, no stream deletion",
    "scheduler": "an external scheduler: publishes work notices, reads no event",
    "monitor": "a monitor: reads events live or replayed through an ephemeral consumer of the "
               "events stream; sends nothing",
}


@dataclass(frozen=True)
class Grant:
    """One NATS user's allow lists (the server refuses everything else)."""

    user: str
    purpose: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responds: bool = False  # allow_responses: it may answer the requests it received

    @property
    def password_variable(self) -> str:
        return f"NOVELBUS_NATS_{self.user.upper()}_PASSWORD"


def commands(s: Subjects) -> dict[str, str]:
    """Every command subject (pattern) by name; `claims-instance` is bus.routes' per-instance one."""
    return {**s.command_subjects(), "claims-instance": f"{s.claims}.*"}


def _api(*tokens: str) -> str:
    return ".".join((JS_API_PREFIX, *tokens))


def _streams(s: Subjects) -> tuple[str, ...]:
    return (s.work_stream, s.events_stream, s.dlq_stream)


def _ensure_streams(s: Subjects) -> list[str]:
    """What `bus.streams.ensure_streams` calls at every process start (and metrics' DLQ depth)."""
    return [_api("STREAM", op, name) for name in _streams(s) for op in ("INFO", "CREATE", "UPDATE")]


def _replay_events(s: Subjects) -> list[str]:
    """An ephemeral ordered consumer of the events stream (`bus.events`, the panel): created
    without a name (nats-py) or with one and its filter (other clients); flow-control replies."""
    return [_api("CONSUMER", "CREATE", s.events_stream), _api("CONSUMER", "CREATE", s.events_stream, ">"),
            f"$JS.FC.{s.events_stream}.>"]


def _work_consumer(s: Subjects) -> list[str]:
    """The driver's durable pull consumer (`bus.consumer`): bind or create it, pull, ack, lag. Acks
    need their own grant: allow_responses lets one reply through, a running unit sends an
    in-progress ack every few seconds before its ack."""
    config = driver_consumer_config(s)
    durable = config.durable_name or ""
    return [_api("CONSUMER", "INFO", s.work_stream, durable), _api("CONSUMER", "CREATE", s.work_stream, durable),
            _api("CONSUMER", "CREATE", s.work_stream, durable, ">"),  # nats-py appends the filter subject
            _api("CONSUMER", "MSG", "NEXT", s.work_stream, durable), f"$JS.ACK.{s.work_stream}.{durable}.>"]


def _check_table(s: Subjects) -> dict[str, str]:
    subjects = commands(s)
    for table, name in ((SERVES, "SERVES"), (SENDS, "SENDS")):
        if missing := sorted(set(subjects) - set(table)):
            raise ValueError(f"command subject(s) {', '.join(missing)} have no entry in bus.permissions.{name}: "
                             "say which user serves and which users send each")
        if stale := sorted(set(table) - set(subjects)):
            raise ValueError(f"bus.permissions.{name} names unknown command(s) {', '.join(stale)}")
    unknown = sorted((set(SERVES.values()) | {u for us in SENDS.values() for u in us}) - set(USERS))
    if unknown:
        raise ValueError(f"bus.permissions names unknown user(s) {', '.join(unknown)}")
    return subjects


def grants(s: Subjects | None = None) -> tuple[Grant, ...]:
    """Every user's allow lists, in `USERS` order; each list sorted."""
    s = s or Subjects()
    subjects = _check_table(s)
    inbox = {u: f"_INBOX_{u}.>" for u in USERS}  # bus.client.connect: each user's private replies
    out = []
    for user in USERS:
        publish = [subjects[c] for c, senders in SENDS.items() if user in senders]
        subscribe = [subjects[c] for c, server in SERVES.items() if server == user] + [inbox[user]]
        if user in NOTICE_SENDERS:
            publish.append(s.work_all)
        if user in EVENT_SENDERS:
            publish.append(s.events_all)
        if user in ACTOR_NAMES or user == "operator":  # `actors.runtime.connected` ensures the streams
            publish += _ensure_streams(s)
        if user == "driver":
            publish += [*_work_consumer(s), s.dead_letter_all]  # dead letters of work notices
        if user == "operator":
            config = driver_consumer_config(s)
            publish += [
                _api("CONSUMER", "INFO", s.work_stream, config.durable_name or ""),  # status: a driver listening
                _api("STREAM", "PURGE", s.events_stream), _api("STREAM", "PURGE", s.work_stream),  # novel delete
                _api("STREAM", "MSG", "GET", s.dlq_stream), _api("STREAM", "MSG", "DELETE", s.dlq_stream),  # dlq
                *_replay_events(s),
            ]
            subscribe.append(s.events_all)
        if user == "monitor":
            publish += [_api("INFO"), _api("STREAM", "INFO", s.events_stream),
                        _api("CONSUMER", "INFO", s.events_stream, ">"), *_replay_events(s)]
            subscribe.append(s.events_all)
        out.append(Grant(user=user, purpose=PURPOSES[user], publish=tuple(sorted(set(publish))),
                         subscribe=tuple(sorted(set(subscribe))), responds=user in SERVES.values()))
    return tuple(out)


def _list(subjects: tuple[str, ...], indent: str) -> str:
    return "[\n" + "".join(f'{indent}  "{x}"\n' for x in subjects) + f"{indent}]"


def render_authorization(users: tuple[Grant, ...]) -> str:
    """The `authorization { users = [...] }` block of a nats-server configuration."""
    lines = ["authorization {", "  users = ["]
    for g in users:
        lines += ["    {", *_wrapped(g.purpose.split(" "), "      # ", sep=" "), f"      user: {g.user}",
                  f"      password: ${g.password_variable}",
                  "      permissions: {", f"        publish: {{ allow: {_list(g.publish, '        ')} }}",
                  f"        subscribe: {{ allow: {_list(g.subscribe, '        ')} }}"]
        if g.responds:
            lines.append("        allow_responses: true")
        lines += ["      }", "    }"]
    return "\n".join([*lines, "  ]", "}", ""])


def _wrapped(words: list[str], prefix: str, *, sep: str = ", ", width: int = 100) -> list[str]:
    """`words` joined by `sep` in lines of at most `width` characters, each starting with `prefix`."""
    lines, line = [], prefix
    for w in words:
        if line != prefix and len(line) + len(w) + len(sep) > width:
            lines.append(line.rstrip())
            line = prefix
        line += w + sep
    return [*lines, line.removesuffix(sep)]


def _header(s: Subjects, users: tuple[Grant, ...]) -> list[str]:
    subjects = commands(s)
    writer = next(g for g in users if g.user == "writer")
    table = [f"#     {subjects[c]:<26} served by {SERVES[c]}, sent by {', '.join(SENDS[c])}" for c in subjects]
    return [
        "# novelbus — NATS server configuration: JetStream and one user per kind of process (OPS-3, OPS-9,",
        "# CLM-5, REL-5).",
        "#",
        "# GENERATED by `novelbus deploy nats-config --out deploy/nats.conf` from bus/permissions.py; edit",
        "# that table, not this file (tests/deploy/test_nats_permissions.py fails when the two differ).",
        "#",
        "#   nats-server -c deploy/nats.conf -sd /var/lib/nats/jetstream",
        "#",
        "# Passwords come from the environment (the server refuses to start when one is missing):",
        *_wrapped([g.password_variable for g in users], "#   "),
        "# Each actor connects with its own user in the URL, e.g.",
        f"#   NOVELBUS_NATS_URL=nats://writer:${writer.password_variable}@nats:4222 novelbus actor writer",
        "# and novelbus then uses the private reply inbox `_INBOX_<user>.>` (bus.client.connect), so no",
        "# user can read another's replies. The extractor, the planner and the endpoint probe run in the",
        "# driver's process and the detector in the verifier's, so they connect as those users.",
        "#",
        "# What it enforces (allow lists: anything not listed is refused by the server):",
        "# - each command subject is served (subscribed) by one user and sent by those that need it:",
        *table,
        f"# - work notices ({s.work_all}) are published by {', '.join(NOTICE_SENDERS)};",
        f"#   events ({s.events_all}) by every actor and the operator (restore); they are read by the",
        "#   operator and the monitor; dead letters are written by the driver's work consumer;",
        "# - the JetStream API: each user may call only what it uses, on novelbus's streams; the actors",
        "#   and the operator ensure the streams (info, create, update); nobody may delete a stream;",
        "#   only the operator may purge a novel's messages or read and delete dead letters;",
        "# - replies: a serving user may answer the requests it received (allow_responses), nothing else.",
        "# Subjects are the production ones (no namespace prefix).",
    ]


def nats_conf(s: Subjects | None = None) -> str:
    """The whole deploy/nats.conf: its header, the server settings and `render_authorization`."""
    s = s or Subjects()
    users = grants(s)
    return "\n".join([
        *_header(s, users),
        "",
        "port: 4222",
        "max_payload: 1MB",
        "",
        "# JetStream on; give the store directory on the command line: nats-server -c nats.conf -sd /data",
        "jetstream {}",
        "",
        render_authorization(users),
    ])
