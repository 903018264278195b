"""The benchmarks (`novelbus bench pack|ab|throughput|chaos|cluster`) and the novel generator they use.

Each module holds one benchmark: its run and its typer command, registered by `cli/bench.py`.
"""
