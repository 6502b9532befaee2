"""The simulator's legacy (vLLM <= 0.23, array form) event structs are the modern ones' leading fields.

``vllm_sim/events.py`` keeps both class sets verbatim, as vLLM wrote them, because msgspec's bytes follow from
the class text. This pins the copy: a field added to or changed in a modern struct's first N fields without the
legacy twin (or the other way round) fails here, not on the wire.
"""

import msgspec
import pytest

from vllm_sim.events import BlockRemoved, BlockStored, LegacyBlockRemoved, LegacyBlockStored


@pytest.mark.parametrize(
    ("legacy", "modern", "n"),
    [(LegacyBlockStored, BlockStored, 11), (LegacyBlockRemoved, BlockRemoved, 3)],
    ids=["BlockStored", "BlockRemoved"],
)
def test_legacy_struct_is_the_modern_ones_first_fields(legacy: type, modern: type, n: int) -> None:
    assert legacy.__struct_fields__ == modern.__struct_fields__[:n]  # type: ignore[attr-defined]
    assert msgspec.structs.fields(legacy) == msgspec.structs.fields(modern)[:n]  # types and defaults too
    assert legacy.__struct_config__.tag == modern.__struct_config__.tag == modern.__name__  # type: ignore[attr-defined]
    assert legacy.__struct_config__.array_like and not modern.__struct_config__.array_like  # type: ignore[attr-defined]
