"""docs/configuration.md documents every key of the fleet spec with its default and range."""

from __future__ import annotations

from pathlib import Path

from llmfleet.commands.reference import (
    BEGIN,
    END,
    PLUGINS_BEGIN,
    PLUGINS_END,
    render_plugin_reference,
    render_reference,
)
from llmfleet.registries import all_registries

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    text = DOC.read_text()
    generated = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert generated == render_reference(), "run: python -m llmfleet.commands.reference --write"


def test_reference_lists_nested_keys_with_ranges() -> None:
    reference = render_reference()
    assert "| `llmfleet:pools[].engine.gpuMemoryUtilization` | float | `0.9` | > 0.0, <= 0.98 |" in reference


def test_plugin_parameter_reference_is_current() -> None:
    text = DOC.read_text()
    generated = text.split(PLUGINS_BEGIN, 1)[1].split(PLUGINS_END, 1)[0].strip()
    assert generated == render_plugin_reference(all_registries()), "run: python -m llmfleet.commands.reference --write"


def test_plugin_reference_lists_each_parameter_with_its_range() -> None:
    reference = render_plugin_reference(all_registries())
    assert "| routing picker | `p2c` | `loadFactor` | float | `1.25` | >= 1.0 |" in reference
    assert "| routing filter | `ready` | none |" in reference
