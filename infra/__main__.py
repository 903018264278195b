"""``python -m infra``: run the servers alone until SIGTERM / Ctrl-C (INFRA-1).

Prints one line ``NOVELBUS_INFRA_READY {json}`` with the URLs and pids once both answer,
then waits. Handy for poking at the embedded servers and used by the INFRA tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from novelbus.infra import Infrastructure, install_signal_handlers

READY = "NOVELBUS_INFRA_READY"


async def serve(home: Path | None, fast: bool) -> None:
    task = asyncio.current_task()
    assert task is not None
    install_signal_handlers(asyncio.get_running_loop(), task)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async with Infrastructure(home=home, fast=fast, log=log) as infra:
        ready = {
            "natsUrl": infra.nats_url,
            "databaseUrl": infra.database_url,
            "embedded": infra.embedded,
            "pids": infra.pids,
        }
        print(READY, json.dumps(ready), flush=True)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra", description=__doc__)
    parser.add_argument("--home", type=Path, default=None, help="data directory")
    parser.add_argument("--fast", action="store_true", help="PostgreSQL without fsync")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.home, args.fast))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("stopped", file=sys.stderr, flush=True)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
