"""``ModelRegistry.resolve``: base names, LoRA names, unknown names."""

from __future__ import annotations

import pytest

from extproc.errors import UnknownModel
from extproc.prompt.models import Adapter, BaseModel, ModelRegistry
from extproc.types import LoraAdapter

BASE, OTHER = BaseModel("Qwen/Qwen3-0.6B"), BaseModel("other")
LORA = LoraAdapter("adapter-x", "/models/adapter-x")


@pytest.fixture
def registry() -> ModelRegistry:
    return ModelRegistry([BASE, OTHER], [Adapter(LORA, "Qwen/Qwen3-0.6B")])


@pytest.mark.parametrize(
    ("name", "base", "lora"),
    [("Qwen/Qwen3-0.6B", BASE, None), ("other", OTHER, None), ("adapter-x", BASE, LORA)],
    ids=["base", "second-base", "lora"],
)
def test_resolve(registry: ModelRegistry, name: str, base: BaseModel, lora: LoraAdapter | None) -> None:
    assert registry.resolve(name) == (base, lora)


@pytest.mark.parametrize("name", ["qwen/qwen3-0.6b", "", "adapter-y", "/models/adapter-x"])
def test_unknown_model_is_404(registry: ModelRegistry, name: str) -> None:
    with pytest.raises(UnknownModel) as info:
        registry.resolve(name)
    assert (info.value.status, info.value.param) == (404, "model")


@pytest.mark.parametrize(
    ("models", "adapters", "match"),
    [
        ([BASE, BASE], [], "twice"),
        ([BASE], [Adapter(LoraAdapter("Qwen/Qwen3-0.6B", "/p"), "Qwen/Qwen3-0.6B")], "already"),
        ([BASE], [Adapter(LORA, "Qwen/Qwen3-0.6B"), Adapter(LORA, "Qwen/Qwen3-0.6B")], "already"),
        ([BASE], [Adapter(LORA, "missing")], "unknown base"),
    ],
    ids=["duplicate-model", "adapter-shadows-model", "duplicate-adapter", "unknown-base"],
)
def test_bad_configs_are_refused(models: list[BaseModel], adapters: list[Adapter], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelRegistry(models, adapters)


def test_views_are_read_only(registry: ModelRegistry) -> None:
    with pytest.raises(TypeError):
        registry.models["x"] = BASE  # type: ignore[index]
    assert set(registry.adapters) == {"adapter-x"}
