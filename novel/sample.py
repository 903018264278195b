"""The bundled demo novel (`novelbus demo`): an original three-chapter mystery in English."""

from __future__ import annotations

from importlib import resources

SAMPLE_RESOURCE = "samples/sample.json"


def sample_novel_bytes() -> bytes:
    """The demo novel file (NovelFile JSON), read from the installed package data."""
    return resources.files("novelbus.novel").joinpath(SAMPLE_RESOURCE).read_bytes()
