"""OPS-5 / REL-11: a server URL that no client could use is refused before anything starts, in
words that name what is wrong and never repeat the URL's user or password; the names that error
messages and logs print (`redact_url`, `server_names`, `database_name`) never raise on one."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from novelbus.bus.client import server_names
from novelbus.infra import NATS_SCHEMES, POSTGRES_SCHEMES, redact_url, url_problem
from novelbus.store.pool import database_name


def nats(url: str) -> str | None:
    return url_problem(url, NATS_SCHEMES, default_scheme="nats")


def pg(url: str) -> str | None:
    return url_problem(url, POSTGRES_SCHEMES, host_required=False)


def test_usable_server_urls_pass() -> None:
    """OPS-5"""
    for url in ("nats://127.0.0.1:4222", "nats://u:p@h", "tls://h:4443", "ws://h:8080", "127.0.0.1:4222",
                "localhost", "nats://a:4222, nats://b:4222,", "nats://[::1]:4222"):
        assert nats(url) is None, url
    for url in ("postgresql://u:p@127.0.0.1:5432/db", "postgres://h/db", "postgresql:///db?host=/run/pg",
                "postgresql://[::1]:5432/db"):
        assert pg(url) is None, url


def test_unusable_server_urls_are_refused_saying_why() -> None:
    """OPS-5"""
    assert nats("http://h:4222") == ("the URL must start with nats:// or tls:// or ws:// or wss://, "
                                     "got http://")
    assert nats("nats://u:p@h:42x2") == "the port in 'h:42x2' is not a number from 0 to 65535"
    assert nats("nats://h:99999") == "the port in 'h:99999' is not a number from 0 to 65535"
    assert nats("nats://:4222") == "the URL names no host"
    assert nats(" , ") == "the URL is empty"
    assert nats("nats://a:1,http://b:2") is not None  # every server of a cluster's list
    assert pg("garbage") == "the URL must start with postgresql:// or postgres://, got no scheme"
    assert pg("mysql://u:p@h/db") == "the URL must start with postgresql:// or postgres://, got mysql://"
    assert pg("postgresql://u:p@h:abc/db") == "the port in 'h:abc' is not a number from 0 to 65535"


SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=24)
PORT = st.one_of(st.integers(0, 70000).map(str), st.text(alphabet=string.ascii_letters, min_size=1, max_size=4))


@given(SECRET, PORT, st.sampled_from(["nats", "http", "postgresql", "mysql", ""]))
def test_no_message_repeats_the_password(secret: str, port: str, scheme: str) -> None:
    """REL-11"""
    prefix = f"{scheme}://" if scheme else ""
    url = f"{prefix}user:{secret}@db.example:{port}/novels"
    for said in (nats(url), pg(url), redact_url(url), server_names(url), database_name(url)):
        assert said is None or secret not in said
    assert f"db.example:{port}" in database_name(url) or not scheme
