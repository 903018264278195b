"""novelbus: bounded-context long-form fiction writing, asyncio actors over NATS and PostgreSQL.

The one import root (ARCH-6). Its rooms live in the repository's top-level folders, one per box of
the architecture picture, and install beneath this package: ``novelbus.messages`` (the wire
contract), ``novelbus.bus`` (transport), ``novelbus.store`` (PostgreSQL), ``novelbus.novel`` (the
pure domain), ``novelbus.writers`` (model providers and the read-only tool registry),
``novelbus.actors`` (the six actors), ``novelbus.infra`` (embedded servers), ``novelbus.app``
(application services the front ends share), ``novelbus.cli`` and ``novelbus.panel`` (the web panel).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("novelbus")
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"

ROOMS = ("messages", "bus", "store", "novel", "writers", "actors", "infra", "app", "cli", "panel")
