"""JUDGE-3: the default writerMode follows the documented verdict, unless the file names a shape."""

from __future__ import annotations

import pytest

from novelbus.novel.outline import NovelConfig
from novelbus.novel.w3 import DEFAULT_WRITER_MODE


def test_a_config_silent_on_the_writer_takes_the_documented_default() -> None:
    """JUDGE-3: neither writerMode nor writerShape: the verdict's default."""
    assert NovelConfig.model_validate({}).writerMode == DEFAULT_WRITER_MODE


@pytest.mark.parametrize("shape", ["W1", "W2"])
def test_a_named_writer_shape_asks_for_the_bounded_writer(shape: str) -> None:
    """JUDGE-3: a W1 or W2 shape is the bounded writer's; without writerMode it is subagent."""
    config = NovelConfig.model_validate({"writerShape": shape})
    assert (config.writerMode, config.writerShape) == ("subagent", shape)
    assert "writerMode" in config.model_fields_set  # novel create prints no default note for it


def test_an_explicit_writer_mode_wins_over_the_shape() -> None:
    """JUDGE-3: a file that says inline gets inline, whatever shape it names."""
    assert NovelConfig.model_validate({"writerShape": "W1", "writerMode": "inline"}).writerMode == "inline"
