"""ARCH-1, ARCH-3, ARCH-5, ARCH-6: the layout shows the architecture, and the boundaries hold.

The structure is drawn from the code's own imports (every `import`, also inside functions, and
relative ones resolved): the rooms are the top-level folders, and they import only downwards —
messages <- novel <- writers/store/bus/infra <- actors <- app (services the front ends share,
with the terminal plumbing of every command and benchmark, `app.terminal`) <- panel, bench (the
benchmarks) <- cli (the commands) — so no two rooms import each other (HOUSE-9); no module
reaches into another module's private names.
"""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Iterator
from pathlib import Path

import msgspec

from novelbus.messages import events as ev
from novelbus.messages.base import tag_of

REPO = Path(__file__).resolve().parents[1]
ACTOR_MODULES = ["driver", "claims", "packer", "writer", "verifier", "usage"]
# actors/ also holds what the actors share or wire, never an actor's own logic used by another.
ACTOR_HELPERS = ["context", "runtime", "unit_flow", "writer_sessions", "accounting", "steering", "extraction",
                 "detection", "serving"]
# The rooms (top-level folders), by layer: a room may import only rooms of a lower layer.
LAYER = {"messages": 0, "novel": 1, "writers": 2, "store": 2, "bus": 2, "infra": 2, "actors": 3, "app": 4,
         "panel": 5, "bench": 5, "cli": 6}


def _imports(path: Path) -> set[str]:
    """Imported module names, with the `novelbus.` root taken off (ARCH-6: every room is under it)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:  # `from .x import y`: resolved from the file
            package = path.relative_to(REPO).parent.parts
            base = ".".join(("novelbus", *package[: len(package) - node.level + 1]))
            node = ast.ImportFrom(module=f"{base}.{node.module}" if node.module else base, names=node.names,
                                  level=0)
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "novelbus":
                out.update(a.name for a in node.names)
            else:
                out.add(node.module)
                # `from novelbus.bus import tally`: the submodule is what is imported
                base = node.module.removeprefix("novelbus.").replace(".", "/")
                out.update(f"{node.module}.{a.name}" for a in node.names
                           if node.module.startswith("novelbus.") and (REPO / base / f"{a.name}.py").is_file())
    return {m.removeprefix("novelbus.") for m in out}


def test_top_level_layout() -> None:
    """ARCH-5"""
    for name in ("pyproject.toml", "actors", "messages", "bus", "tests", "deploy", "store", "novel", "cli"):
        assert (REPO / name).exists(), name
    for actor in ACTOR_MODULES:  # one file per actor
        assert (REPO / "actors" / f"{actor}.py").is_file(), actor


def test_each_room_holds_one_job() -> None:
    """HOUSE-3: the benchmarks and the novel generator they use are in bench/, the process
    supervisor in infra/; cli/ registers the benchmarks (cli/bench.py) and holds no benchmark."""
    assert not list((REPO / "cli").glob("bench_*.py")) and not (REPO / "cli" / "supervise.py").exists()
    assert not (REPO / "novel" / "generate.py").exists() and (REPO / "bench" / "generate.py").is_file()
    assert (REPO / "infra" / "supervise.py").is_file()
    registered = {m.removeprefix("bench.") for m in _imports(REPO / "cli" / "bench.py") if m.startswith("bench.")}
    commands = {p.stem for p in (REPO / "bench").glob("*.py")
                if any(isinstance(n, ast.FunctionDef) and any(isinstance(a.annotation, ast.Subscript)
                                                              and "typer.Option" in ast.unparse(a.annotation)
                                                              for a in n.args.args)
                       for n in ast.parse(p.read_text()).body)}
    assert commands and commands <= registered, commands - registered


def test_no_actor_imports_another_actors_internals() -> None:
    """ARCH-1"""
    for actor in ACTOR_MODULES:
        imported = _imports(REPO / "actors" / f"{actor}.py")
        others = {f"actors.{o}" for o in ACTOR_MODULES if o != actor}
        assert not (imported & others), (actor, imported & others)
    # Helpers serve actors; they never import one (else an actor would reach another through them).
    # runtime.py is the exception by design: it starts the actors.
    assert {p.stem for p in (REPO / "actors").glob("*.py")} - {"__init__"} == {*ACTOR_MODULES, *ACTOR_HELPERS}
    for helper in ACTOR_HELPERS:
        if helper == "runtime":
            continue
        imported = _imports(REPO / "actors" / f"{helper}.py")
        assert not (imported & {f"actors.{a}" for a in ACTOR_MODULES}), (helper, imported)


def test_pure_domain_does_no_io() -> None:
    """ARCH-3: novel/ is pure: no database, bus, network, clock or randomness imports."""
    banned = {"asyncpg", "nats", "socket", "random", "time", "datetime", "asyncio", "os", "subprocess",
              "store", "bus", "actors", "openai"}
    for path in (REPO / "novel").rglob("*.py"):
        roots = {m.split(".")[0] for m in _imports(path)}
        assert not (roots & banned), (path.name, roots & banned)


def test_messages_are_data_only() -> None:
    """BUS-1: messages/ imports nothing but msgspec, typing and other message/body modules."""
    allowed = {"__future__", "typing", "msgspec", "messages", "re", "dataclasses"}
    for path in (REPO / "messages").glob("*.py"):
        roots = {m.split(".")[0] for m in _imports(path)}
        assert roots <= allowed, (path.name, roots - allowed)


# --- the room graph (HOUSE-9) ---------------------------------------------------------------------


def _room_modules() -> Iterator[tuple[str, Path]]:
    for folder in LAYER:
        for path in sorted((REPO / folder).rglob("*.py")):
            room = _room_of(".".join(path.relative_to(REPO).with_suffix("").parts))
            assert room is not None, path
            yield room, path


def _room_of(module: str) -> str | None:
    """The room (top-level folder) `module` belongs to; None for a module outside the rooms."""
    room = module.split(".")[0]
    return room if room in LAYER else None


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {room: set() for room in LAYER}
    for room, path in _room_modules():
        for module in _imports(path):
            other = _room_of(module)
            if other is not None and other != room:
                graph[room].add(other)
    return graph


def test_arch_writers_import_no_actors_bus_store_or_infra() -> None:
    """writers/ is models and tools only: it never reaches the bus, the store or the servers."""
    for path in (REPO / "writers").rglob("*.py"):
        rooms = {_room_of(m) for m in _imports(path)}
        assert not rooms & {"actors", "bus", "store", "infra", "app", "panel", "cli", "bench"}, (
            path.name, rooms)


def test_arch_rooms_import_only_downwards() -> None:
    """HOUSE-9: messages <- novel <- writers/store/bus/infra <- actors <- app <- panel, bench <- cli."""
    upward = sorted((room, other) for room, others in room_graph().items() for other in others
                    if LAYER[other] >= LAYER[room])
    assert not upward, f"upward or sideways imports between rooms: {upward}"


def test_arch_no_cycle_between_rooms() -> None:
    """HOUSE-9: no two rooms import each other, directly or through others."""
    graph = room_graph()
    state: dict[str, int] = {}

    def visit(room: str, trail: list[str]) -> None:
        state[room] = 1
        for other in sorted(graph[room]):
            assert state.get(other) != 1, f"cycle: {' -> '.join([*trail, room, other])}"
            if other not in state:
                visit(other, [*trail, room])
        state[room] = 2

    for room in sorted(graph):
        if room not in state:
            visit(room, [])


def test_arch_no_module_imports_another_modules_private_names() -> None:
    """`from x import _name` of another module, or a private module (`room._mod`) of another room."""
    bad: list[str] = []
    for room, path in _room_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("novelbus"):
                bad += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.endswith("__")]
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.startswith("novelbus")]
            for module in modules:
                parts = module.split(".")[1:]
                if parts and parts[0] != room and any(p.startswith("_") for p in parts[1:]):
                    bad.append(f"{path.relative_to(REPO)}: {module}")
    assert not bad, bad


def test_no_loop_writes_its_own_backoff() -> None:
    """HOUSE-3: a wait before another try comes from a `RetryPolicy` (novel/retry.py), never from
    arithmetic on an attempt count at the call site (`min(5.0, 0.25 * 2 ** attempt)`)."""
    found: list[str] = []
    for _room, path in _room_modules():
        if path == REPO / "novel" / "retry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "sleep"
                    and node.args):
                continue
            if isinstance(node.args[0], ast.Call) and getattr(node.args[0].func, "attr", "") == "delay_s":
                continue  # a policy's wait
            inner = list(ast.walk(node.args[0]))
            counted = any(isinstance(n, ast.Name | ast.Attribute) and any(
                w in (n.id if isinstance(n, ast.Name) else n.attr) for w in ("attempt", "restart", "retr", "deliver"))
                for n in inner)
            if any(isinstance(n, ast.BinOp) for n in inner) and counted or any(
                    isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in inner):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


# --- the event contract ------------------------------------------------------------------------------


def _event_classes() -> list[type[ev.Event]]:
    return [c for _, c in inspect.getmembers(ev, inspect.isclass)
            if issubclass(c, ev.Event) and c is not ev.Event and c.__module__ == ev.__name__]


def test_every_event_class_is_in_the_event_union() -> None:
    """BUS-3"""
    union = set(typing.get_args(ev.NovelEvent))
    classes = set(_event_classes())
    assert classes - union == set(), f"events missing from NovelEvent: {sorted(c.__name__ for c in classes - union)}"
    assert union <= classes
    tags = [tag_of(c) for c in classes]
    assert len(tags) == len(set(tags)), "two event classes share a type tag"


def test_no_reply_or_command_shares_a_name_with_an_event() -> None:
    """BUS-1"""
    events = {c.__name__ for c in _event_classes()}
    for path in (REPO / "messages").glob("*.py"):
        if path.stem in ("events", "__init__"):
            continue
        tree = ast.parse(path.read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assert not names & events, (path.name, names & events)


def test_event_tags_are_taken_from_the_classes_never_spelled_as_literals() -> None:
    """BUS-3: An event's `type` tag is declared once, on its class; everything else uses `tag_of(cls)`."""
    tags = {tag_of(c) for c in _event_classes()}
    found: list[str] = []
    for _room, path in _room_modules():
        if path == REPO / "messages" / "events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in tags:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
            # SQL naming an event type inside a longer string
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {t!r} in a string" for t in tags
                          if f"'{t}'" in node.value]
    assert not found, found


def test_messages_structs_are_frozen() -> None:
    for c in _event_classes():
        assert issubclass(c, msgspec.Struct) and c.__struct_config__.frozen, c.__name__
