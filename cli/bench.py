"""`novelbus bench …`: benchmarks that print figures (and one JSON object with --json).

Every bench is registered here, explicitly: a new bench is a module with one command function
(figures printed beside their targets; shared helpers in `bench.common`) and one line below.
"""

import typer

from novelbus.bench.ab import bench_ab
from novelbus.bench.chaos import chaos
from novelbus.bench.cluster import cluster
from novelbus.bench.pack import pack
from novelbus.bench.serve import bench_serve
from novelbus.bench.throughput import bench_throughput
from novelbus.cli.common import check_environment

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: pack, ab, throughput, chaos, cluster, serve.")
# A benchmark runs with `app.terminal.run`, below the command line: its `NOVELBUS_*` settings are
# checked here, before it starts, as every command's are.
bench_app.callback()(check_environment)
bench_app.command("pack")(pack)
bench_app.command("ab")(bench_ab)
bench_app.command("throughput")(bench_throughput)
bench_app.command("chaos")(chaos)
bench_app.command("cluster")(cluster)
bench_app.command("serve")(bench_serve)
