"""``RouterConfig``'s scheduling section: the profile as a tagged union, and the old flat spelling."""

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from extproc.config import (
    RouterConfig,
    SchedulingConfig,
    TenantClass,
    TtftProfileConfig,
    WeightedProfileConfig,
    load_config,
)
from extproc.scheduling.scorers import SCORERS
from extproc.types import Tenant

BASE: dict[str, Any] = {"models": [{"name": "m"}], "endpoints": [{"address": "127.0.0.1:8000"}]}


def config(scheduling: dict[str, Any]) -> RouterConfig:
    return RouterConfig.model_validate({**BASE, "scheduling": scheduling})


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "extproc.config" and "deprecated" in r.getMessage()]


def test_the_default_is_the_ttft_profile_with_its_defaults(caplog: pytest.LogCaptureFixture) -> None:
    s = config({}).scheduling
    assert s.profile == TtftProfileConfig()
    assert s.profile.stickiness_s == 0.2
    assert deprecations(caplog) == []


@pytest.mark.parametrize(
    ("scheduling", "profile"),
    [
        ({"profile": {"type": "ttft", "stickiness_s": 0.3}}, TtftProfileConfig(stickiness_s=0.3)),
        ({"profile": {"type": "weighted"}}, WeightedProfileConfig(type="weighted")),
        (
            {"profile": {"type": "weighted", "weights": {"prefix": 1.0}}},
            WeightedProfileConfig(type="weighted", weights={"prefix": 1.0}),
        ),
    ],
    ids=["ttft", "weighted-default-weights", "weighted-weights"],
)
def test_new_spelling(scheduling: dict[str, Any], profile: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert config({**scheduling, "fallbacks": 1}).scheduling == SchedulingConfig(profile=profile, fallbacks=1)
    assert deprecations(caplog) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            {"profile": "ttft", "stickiness_s": 0.3, "tie_epsilon_s": 0.01, "fallbacks": 1},
            {"profile": {"type": "ttft", "stickiness_s": 0.3, "tie_epsilon_s": 0.01}, "fallbacks": 1},
        ),
        ({"stickiness_s": 0.3}, {"profile": {"type": "ttft", "stickiness_s": 0.3}}),
        ({"profile": "weighted"}, {"profile": {"type": "weighted"}}),
        (
            {"profile": {"type": "ttft", "tie_epsilon_s": 0.01}, "stickiness_s": 0.3},
            {"profile": {"type": "ttft", "tie_epsilon_s": 0.01, "stickiness_s": 0.3}},
        ),
        (
            {"profile": "weighted", "weights": {"kv": 1.0}, "prefill_tokens_per_s": 5000.0},
            {"profile": {"type": "weighted", "weights": {"kv": 1.0}}, "prefill_tokens_per_s": 5000.0},
        ),
    ],
    ids=["ttft-flat", "knob-without-profile", "weighted-name", "flat-beside-a-profile", "weighted-flat"],
)
def test_old_spelling_is_read_with_one_warning_naming_the_new(
    old: dict[str, Any], new: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert config(old).scheduling == config(new).scheduling
    (warning,) = deprecations(caplog)
    assert "scheduling.profile: {'type'" not in warning and "scheduling.profile: {type: " in warning, warning


def test_old_spelling_drops_the_other_profiles_knobs_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """The old spelling accepted (and ignored) weights beside the ttft profile: still accepted, still ignored."""
    caplog.set_level(logging.WARNING)
    s = config({"profile": "ttft", "weights": {"prefix": 1.0}, "stickiness_s": 0.3}).scheduling
    assert s.profile == TtftProfileConfig(stickiness_s=0.3)
    (warning,) = deprecations(caplog)
    assert "weights" in warning and "dropped" in warning


def test_load_config_warns_once_per_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "picker.yaml"
    path.write_text(
        "models: [{name: m}]\nendpoints: [{address: '127.0.0.1:8000'}]\n"
        "scheduling: {profile: ttft, stickiness_s: 0.3, min_prefix_share: 0.1}\n"
    )
    caplog.set_level(logging.WARNING)
    profile = load_config(path).scheduling.profile
    assert isinstance(profile, TtftProfileConfig) and (profile.stickiness_s, profile.min_prefix_share) == (0.3, 0.1)
    assert len(deprecations(caplog)) == 1


@pytest.mark.parametrize(
    ("scheduling", "message"),
    [
        ({"profile": {"type": "weighted", "weights": {"prefix": 1.0, "fresh": 2.0}}}, "unknown scorers ['fresh']"),
        ({"profile": "weighted", "weights": {"fresh": 2.0}}, "unknown scorers ['fresh']"),
        ({"profile": {"type": "weighted", "stickiness_s": 0.3}}, "stickiness_s belong(s) to profile type 'ttft'"),
        ({"profile": {"type": "ttft", "weights": {"kv": 1.0}}}, "weights belong(s) to profile type 'weighted'"),
        ({"profile": {"type": "ttft", "stickiness_s": 0.2}, "stickiness_s": 0.3}, "stickiness_s given twice"),
        ({"profile": "fastest"}, "unknown profile 'fastest'"),
        ({"profile": {"type": "fastest"}}, "does not match any of the expected tags"),
        ({"profile": {"type": "ttft", "stickyness_s": 0.3}}, "stickyness_s"),
    ],
    ids=[
        "unknown-scorer",
        "unknown-scorer-old-spelling",
        "ttft-knob-on-weighted",
        "weights-on-ttft",
        "given-both-ways",
        "unknown-profile-name",
        "unknown-profile-type",
        "typo",
    ],
)
def test_bad_scheduling_is_a_clear_error(scheduling: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        config(scheduling)


def test_the_scorer_error_lists_the_registry() -> None:
    with pytest.raises(ValidationError) as info:
        WeightedProfileConfig(type="weighted", weights={"fresh": 1.0})
    assert all(name in str(info.value) for name in SCORERS)


def test_every_config_field_is_described() -> None:
    undescribed = [
        f"{model.__name__}.{name}"
        for model in _models(RouterConfig)
        for name, info in model.model_fields.items()
        if not info.description
    ]
    assert undescribed == []
    names = {m.__name__ for m in _models(RouterConfig)}
    assert {"MemoryIndexConfig", "RedisIndexConfig", "LeasesConfig", "TtftProfileConfig"} <= names  # unions walked


def test_every_tenant_setting_reaches_the_tenant() -> None:
    """``TenantResolver`` passes a class's fields by name: each ``TenantClass`` field must be a ``Tenant`` field."""
    assert set(TenantClass.model_fields) <= set(Tenant.__dataclass_fields__) - {"id"}


def _models(root: type) -> list[type]:
    from pydantic import BaseModel

    seen: list[type] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for info in model.model_fields.values():  # type: ignore[attr-defined]
            for arg in _types(info.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    todo.append(arg)
    return seen


def _types(annotation: object) -> list[object]:
    from typing import get_args

    args = get_args(annotation)
    return [annotation] if not args else [t for a in args for t in _types(a)]
