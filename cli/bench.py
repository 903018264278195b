"""`novelbus bench …`: benchmarks that print figures (and one JSON object with --json)."""

import typer

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: pack, ab, throughput, chaos.")
