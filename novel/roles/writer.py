"""The writer's projection (CTX-8, PACK-1..5): the pack text, exactly what the writer model reads."""

from __future__ import annotations

from typing import Any

from novelbus.novel.pack import render_writer_pack
from novelbus.novel.roles import RoleInputs


def project(inputs: RoleInputs) -> dict[str, Any]:
    """``{"pack": text}``: the writer pack of the frozen context in the inputs' shape."""
    return {"pack": render_writer_pack(inputs.frozen, inputs.shape).text}
