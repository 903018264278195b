"""The reference pages of the docs site, generated from the code at build time (HOUSE-2).

An MkDocs hook (`hooks:` in mkdocs.yml): `on_files` adds three pages that exist only in the
built site, never in git, so they cannot drift from the code:

- `reference/cli.md` — every command of the typer app (`novelbus.cli.main.app`), its usage,
  arguments and options, walked through click's own command tree;
- `reference/configuration.md` — every `NOVELBUS_*` setting of the settings registry
  (`novelbus.cli.common.checked_settings` and `FREE_FORM_SETTINGS`): what each takes is the
  validator's own message for a malformed value, what it does is the reader's docstring;
- `reference/novel-file.md` — every field of a novel file (`NovelFile`, with `NovelConfig`),
  flattened from the pydantic model's JSON Schema, so a field added to the model appears here.

The page builders are plain functions returning Markdown (tests/test_docs_reference.py calls
them without MkDocs).
"""

from __future__ import annotations

import html
import inspect
import json
import os
import re
from collections.abc import Iterator
from typing import Any

PAGES = {
    "reference/cli.md": "cli_page",
    "reference/configuration.md": "configuration_page",
    "reference/novel-file.md": "novel_file_page",
}

_MALFORMED = "not-a-valid-value-for-the-docs"


def _escape(text: str) -> str:
    """Text for a Markdown table cell or paragraph: HTML-escaped and `|`/`*` escaped outside code
    spans (inside a backtick span Markdown shows characters as they are)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(html.escape(part, quote=False).replace("|", "\\|").replace("*", "\\*"))
    return "".join(out)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


# --- the command line ---------------------------------------------------------------------------

def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "list_commands")  # typer may bring its own copy of click: no isinstance


def _is_option(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "option"


def _commands() -> Iterator[tuple[list[str], Any, Any]]:
    import typer.main

    from novelbus.cli.main import app

    def walk(path: list[str], cmd: Any, ctx: Any) -> Iterator[tuple[list[str], Any, Any]]:
        yield path, cmd, ctx  # a group, then each of its commands: depth first, in their order
        if _is_group(cmd):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and not getattr(sub, "hidden", False):
                    yield from walk([*path, name], sub, sub.context_class(sub, info_name=name, parent=ctx))

    root = typer.main.get_command(app)
    yield from walk(["novelbus"], root, root.context_class(root, info_name="novelbus"))


def _default(param: Any) -> str:
    default = param.default
    if callable(default) or default is None or default is False or default == ():
        return ""
    if _is_option(param) and param.is_flag and default is True:
        return "on"
    if hasattr(default, "value"):  # an Enum
        default = default.value
    return f"`{default}`"


def _kind(param: Any, ctx: Any) -> str:
    if _is_option(param) and param.is_flag:
        return "flag"
    shown = param.display_type(ctx) if hasattr(param, "display_type") else param.type.name
    return str(shown).strip("<>") or "text"


def _param_row(param: Any, ctx: Any) -> str:
    if _is_option(param):
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        if param.envvar:
            names += f" (env `{param.envvar}`)"
    else:
        names = f"`{getattr(param, 'human_readable_name', None) or param.name.upper()}`"
    kind = _kind(param, ctx)
    required = " (required)" if param.required else ""
    help_text = _escape(_one_line(getattr(param, "help", None)))
    return f"| {names} | {kind}{required} | {_default(param)} | {help_text} |"


def cli_page() -> str:
    lines = [
        "# Command-line reference",
        "",
        "Generated from the `novelbus` typer app (`cli/main.py` and the modules it registers) "
        "each time the site is built. `novelbus COMMAND --help` prints the same.",
        "",
    ]
    for path, cmd, ctx in _commands():
        depth = min(len(path), 4)
        lines += [f"{'#' * (depth + 1)} {' '.join(path)}", ""]
        help_text = _one_line(cmd.help)
        if help_text:
            lines += [_escape(help_text), ""]
        if _is_group(cmd):
            subs = [n for n in cmd.list_commands(ctx)
                    if not getattr(cmd.get_command(ctx, n), "hidden", False)]
            lines += ["Commands: " + ", ".join(f"`{n}`" for n in subs) + ".", ""]
            continue
        pieces = [re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), piece)
                  for piece in cmd.collect_usage_pieces(ctx)]
        lines += ["```", " ".join([*path, *pieces]), "```", ""]
        params = [p for p in cmd.get_params(ctx)
                  if not getattr(p, "hidden", False) and p.name != "help"]
        if params:
            lines += ["| argument / option | type | default | meaning |", "|---|---|---|---|"]
            lines += [_param_row(p, ctx) for p in params]
            lines.append("")
    return "\n".join(lines)


# --- the settings registry ----------------------------------------------------------------------

def _accepts(name: str, reader: Any) -> str:
    """What a checked setting takes: its validator's own message for a malformed value — a word no
    setting accepts, else a path to a file (for a setting that wants a directory) — with the value
    cut off (`NOVELBUS_X must be …, got '…'` → `must be …`)."""
    old = os.environ.get(name)
    message = ""
    try:
        for value in (_MALFORMED, __file__):
            os.environ[name] = value
            try:
                reader()
            except Exception as e:  # noqa: BLE001 - ValueError or ProviderError: both carry the message
                message = str(getattr(e, "message", None) or e).replace(value, "…")
                break
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
    message = re.split(r", got |; ", message, maxsplit=1)[0]
    return message.removeprefix(name).strip()


def _first_paragraph(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return _one_line(doc.split("\n\n")[0])


def configuration_page() -> str:
    from novelbus.cli.common import FREE_FORM_SETTINGS, checked_settings

    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings registry in `cli/common.py` each time the site is built. "
        "Every `NOVELBUS_*` variable the code reads is in one of the two tables "
        "(`tests/test_settings.py` fails otherwise).",
        "",
        "## Settings checked before a command starts",
        "",
        "A malformed value stops every command before it starts anything: exit status 2, one "
        "line naming the variable, what it takes and what it got.",
        "",
        "| variable | takes | what it does | read by |",
        "|---|---|---|---|",
    ]
    for name, reader in sorted(checked_settings().items()):
        where = f"`{reader.__module__.removeprefix('novelbus.')}.{reader.__name__}`"
        lines.append(f"| `{name}` | {_escape(_accepts(name, reader))} | "
                     f"{_escape(_first_paragraph(reader))} | {where} |")
    lines += [
        "",
        "## Free-form settings",
        "",
        "Checked where they are used (by connecting, by the provider, by the panel); a secret is "
        "never echoed.",
        "",
        "| variable | how it is checked |",
        "|---|---|",
    ]
    for name, why in sorted(FREE_FORM_SETTINGS.items()):
        shown = f"{name}<ACTOR>" if name.endswith("_") else name
        lines.append(f"| `{shown}` | {_escape(_one_line(why))} |")
    lines += [
        "",
        "Flags win over the environment: `--home`, `--nats-url`, `--database-url`, `--model` "
        "(see the [command-line reference](cli.md)). A novel's own settings are in its "
        "[novel file](novel-file.md).",
        "",
    ]
    return "\n".join(lines)


# --- the novel file -----------------------------------------------------------------------------

def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref:
        return _resolve(defs[ref.rsplit("/", 1)[1]], defs)
    return schema


def _describe(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    schema = _resolve(schema, defs)
    if "anyOf" in schema:
        kinds = [_describe(s, defs) for s in schema["anyOf"]]
        return " or ".join(dict.fromkeys(kinds))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_describe(schema.get('items', {}), defs)}"
    if kind == "object":
        return "object"
    bounds = []
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
                      ("exclusiveMaximum", "<"), ("minLength", "length ≥"), ("maxLength", "length ≤")):
        if key in schema:
            bounds.append(f"{sign} {schema[key]:,}" if isinstance(schema[key], int) else f"{sign} {schema[key]}")
    if "pattern" in schema:
        bounds.append(f"matching `{schema['pattern']}`")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _object_of(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a field holds (directly, or as the non-null branch of an optional)."""
    schema = _resolve(schema, defs)
    if schema.get("type") == "object" and "properties" in schema:
        return schema
    for branch in schema.get("anyOf", []):
        found = _object_of(branch, defs)
        if found is not None:
            return found
    return None


def _rows(schema: dict[str, Any], defs: dict[str, Any], prefix: str) -> Iterator[str]:
    required = set(schema.get("required", []))
    for name, field in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        nested = _object_of(field, defs)
        resolved = _resolve(field, defs)
        items = resolved.get("items") if resolved.get("type") == "array" else None
        item_object = _object_of(items, defs) if items else None
        default = field.get("default", resolved.get("default"))
        shown_default = "" if name in required or default in (None, [], {}) else f"`{json.dumps(default)}`"
        if nested is not None:
            description = nested.get("description") or field.get("description") or ""
            optional = " (or `null`)" if "anyOf" in resolved else ""
            yield (f"| `{path}` | object{optional} | | {_escape(_one_line(description))} |")
            yield from _rows(nested, defs, f"{path}.")
            continue
        kind = _describe(field, defs) + (" (required)" if name in required else "")
        description = _one_line(field.get("description") or resolved.get("description") or "")
        if item_object is not None:
            description = description or _one_line(item_object.get("description"))
        yield f"| `{path}` | {kind} | {shown_default} | {_escape(description)} |"
        if item_object is not None:
            yield from _rows(item_object, defs, f"{path}[].")


def novel_file_page() -> str:
    from novelbus.novel.outline import NovelFile

    schema = NovelFile.model_json_schema()
    defs = schema.get("$defs", {})
    lines = [
        "# Novel file reference",
        "",
        "Generated from the pydantic models in `novel/outline.py` (`NovelFile`, its `NovelConfig` "
        "and `Outline`) each time the site is built. `novelbus novel create FILE` reads this "
        "JSON; `novelbus novel config NOVEL --set PATH=VALUE` changes a `config.` field of a "
        "running novel by the same path, validated the same way. Unknown fields are refused. "
        "`novel/samples/sample.json` is a complete example.",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
        *_rows(schema, defs, ""),
        "",
        "The writer pack's per-field limits (in code points) are checked at create too: the "
        "title and each `story` field 400, each chapter and scene field 300, a foreshadowing "
        "description 400.",
        "",
    ]
    return "\n".join(lines)


# --- the MkDocs hook ----------------------------------------------------------------------------

def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, builder in PAGES.items():
        files.append(File.generated(config, uri, content=globals()[builder]()))
    return files
