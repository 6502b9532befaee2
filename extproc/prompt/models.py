"""Which model names the fleet serves: base models (tokenizer, template settings) and the LoRA adapters on them.

Built once from the config by the composition root; immutable afterwards (a config reload builds a new one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from extproc.errors import UnknownModel
from extproc.types import LoraAdapter


@dataclass(frozen=True, slots=True)
class BaseModel:
    """One served base model, as vLLM's ``--served-model-name`` names it.

    ``tokenizer_dir`` defaults to ``tokenizer_cache/<name>/``. ``content_format`` mirrors vLLM's
    ``--chat-template-content-format`` ("auto" detects it from the template); ``default_chat_template_kwargs``
    mirrors ``--default-chat-template-kwargs``.
    """

    name: str
    tokenizer_dir: Path | None = None
    content_format: str = "auto"
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter served on ``base``; ``lora.path`` must be the path vLLM registered (it is hashed)."""

    lora: LoraAdapter
    base: str


class ModelRegistry:
    """Resolves the ``model`` field of a request to (base model, LoRA adapter or None)."""

    def __init__(self, models: Iterable[BaseModel], adapters: Iterable[Adapter] = ()) -> None:
        """Raises ``ValueError`` for duplicate names, or an adapter on an unknown base model."""
        by_name: dict[str, BaseModel] = {}
        for model in models:
            if model.name in by_name:
                raise ValueError(f"model {model.name!r} is configured twice")
            by_name[model.name] = model
        loras: dict[str, Adapter] = {}
        for adapter in adapters:
            name = adapter.lora.name
            if name in by_name or name in loras:
                raise ValueError(f"adapter name {name!r} is already a model or adapter name")
            if adapter.base not in by_name:
                raise ValueError(f"adapter {name!r} names unknown base model {adapter.base!r}")
            loras[name] = adapter
        self._models: Mapping[str, BaseModel] = MappingProxyType(by_name)
        self._adapters: Mapping[str, Adapter] = MappingProxyType(loras)

    @property
    def models(self) -> Mapping[str, BaseModel]:
        """Base models by served name (read-only)."""
        return self._models

    @property
    def adapters(self) -> Mapping[str, Adapter]:
        """LoRA adapters by name (read-only)."""
        return self._adapters

    def resolve(self, model_name: str) -> tuple[BaseModel, LoraAdapter | None]:
        """The base model and adapter a request names; vLLM treats a LoRA name in ``model`` as "use it".

        Raises ``UnknownModel`` (404) for a name that is neither.
        """
        if (model := self._models.get(model_name)) is not None:
            return model, None
        if (adapter := self._adapters.get(model_name)) is not None:
            return self._models[adapter.base], adapter.lora
        raise UnknownModel(f"the model {model_name!r} does not exist", param="model")
