"""HOUSE-2: the docs site's reference pages are generated from the code and miss nothing.

docs/hooks/reference.py builds them when MkDocs runs; these tests call its page builders directly
(no MkDocs needed) and hold each page to the code it is generated from.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import typer.main

from novelbus.cli.common import FREE_FORM_SETTINGS, checked_settings
from novelbus.cli.main import app
from novelbus.novel.outline import NovelConfig

HOOK = Path(__file__).resolve().parent.parent / "docs" / "hooks" / "reference.py"


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _command_paths() -> set[str]:
    root = typer.main.get_command(app)
    paths: set[str] = set()

    def walk(cmd: object, path: list[str], ctx: object) -> None:
        paths.add(" ".join(path))
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):  # type: ignore[attr-defined]
                sub = cmd.get_command(ctx, name)  # type: ignore[attr-defined]
                if sub is not None and not getattr(sub, "hidden", False):
                    walk(sub, [*path, name], sub.context_class(sub, info_name=name, parent=ctx))

    walk(root, ["novelbus"], root.context_class(root, info_name="novelbus"))
    return paths


def test_the_cli_reference_has_every_command_and_option() -> None:
    """HOUSE-2: every command of the typer app has its heading, and its options their rows."""
    page = _reference().cli_page()
    headings = set(re.findall(r"^#{2,5} (novelbus(?: [\w-]+)*)$", page, re.M))
    assert headings == _command_paths()
    assert "`--nats-url`" in page and "`--latency-units`" in page


def test_the_configuration_reference_has_every_setting() -> None:
    """HOUSE-2: every setting of the registry is listed, a checked one with what it takes."""
    page = _reference().configuration_page()
    for name in checked_settings():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        takes = row.split(" | ")[1]
        assert takes.strip(), row  # the validator's own message for a malformed value
    for name in FREE_FORM_SETTINGS:
        assert f"`{name}" in page, name


def test_the_novel_file_reference_has_every_config_field() -> None:
    """HOUSE-2: every field of NovelConfig, nested ones included, has a row by its path."""
    page = _reference().novel_file_page()

    def paths(schema: dict[str, object], defs: dict[str, dict[str, object]], prefix: str) -> set[str]:
        found: set[str] = set()
        for name, field in schema.get("properties", {}).items():  # type: ignore[union-attr]
            found.add(prefix + name)
            ref = field.get("$ref") or next((b["$ref"] for b in field.get("anyOf", []) if "$ref" in b), None)
            if ref:
                found |= paths(defs[ref.rsplit("/", 1)[1]], defs, f"{prefix}{name}.")
        return found

    schema = NovelConfig.model_json_schema()
    expected = paths(schema, schema.get("$defs", {}), "config.")
    rows = set(re.findall(r"^\| `([^`]+)` \|", page, re.M))
    assert expected and expected <= rows, sorted(expected - rows)


ROOT = HOOK.parent.parent.parent
DOC_TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ROOMS = "tests|store|actors|bus|novel|writers|cli|bench|infra|app|panel|messages|deploy|examples|docs"
NAMED_PATH = re.compile(rf"`((?:{ROOMS})/[A-Za-z0-9_./-]*)`")
WRITTEN_BY_THE_USER = {"deploy/.env"}


def test_the_files_the_docs_name_exist() -> None:
    """HOUSE-2: a file or folder the README or a docs page names in code type exists, so a moved
    or renamed module or test shows up here instead of misleading a reader."""
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOC_TEXTS
               for path in NAMED_PATH.findall(doc.read_text(encoding="utf-8"))
               if path not in WRITTEN_BY_THE_USER and not (ROOT / path.rstrip("/")).exists()]
    assert not missing, "\n".join(missing)


def test_the_readme_is_short_and_the_docs_keep_no_journal() -> None:
    """HOUSE-2: the README fits in 300 lines; neither it nor the docs cite commits or dated runs."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
    commit = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b|\b[0-9a-f]{40}\b")
    dated = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d(?:–\d\d:\d\d)? UTC\b")
    found = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()[:80]}" for doc in DOC_TEXTS
             for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
             if commit.search(line) or dated.search(line)]
    assert not found, "\n".join(found)
