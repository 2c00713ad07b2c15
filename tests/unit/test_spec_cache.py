"""Validated create settings read back from disk (``runtime.spec_cache``) must answer
every question create asks exactly as the validated model does, and only for settings
that validated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentbox.config.specs import SandboxSpec
from agentbox.errors import InvalidRequest
from agentbox.runtime.runtime import pool_key
from agentbox.runtime.spec_cache import StoredSpec, validated

SETTINGS: list[dict[str, Any]] = [
    {},
    {"template": "default", "memory": "512MiB", "disk": "1GiB", "cpus": 0.5, "pids": 64},
    {"lifetime": "15m", "idle_timeout": "never", "on_idle": "destroy", "env": {"A": "b"}},
    {"network": "none"},
    {"network": {"mode": "allowlist", "allow": ["pypi.org", "*.pythonhosted.org"]}},
    {"isolation": "gvisor", "project": "p1"},
]
FIELDS = ("template", "isolation", "on_idle", "memory", "pids", "cpus", "disk", "lifetime")


def _json(value: object) -> object:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("settings", SETTINGS)
def test_a_stored_spec_answers_as_the_validated_one(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    first = validated(tmp_path, settings)
    assert isinstance(first, SandboxSpec)  # validated, then remembered
    again = validated(tmp_path, settings)
    assert isinstance(again, StoredSpec)
    for field in FIELDS:
        assert getattr(again, field) == getattr(first, field), field
        assert type(getattr(again, field)) is type(getattr(first, field)), field
    assert again.network.mode == first.network.mode
    assert again.network.credentials == list(first.network.credentials)
    assert again.model_dump() == _json(first.model_dump())
    include = {"template", "memory", "network"}
    assert again.model_dump(include=include) == _json(first.model_dump(include=include))
    assert pool_key(again) == pool_key(first)


def test_settings_that_fail_validation_are_never_stored(tmp_path: Path) -> None:
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            validated(tmp_path, {"memory": "lots"})
    assert not (tmp_path / "cache").exists()


def test_each_setting_has_its_own_entry_and_a_damaged_one_is_validated_again(
    tmp_path: Path,
) -> None:
    validated(tmp_path, {"memory": "512MiB"})
    validated(tmp_path, {"memory": "1GiB"})
    entries = sorted((tmp_path / "cache" / "specs").iterdir())
    assert len(entries) == 2
    for entry in entries:
        entry.write_text("{not json")
    assert isinstance(validated(tmp_path, {"memory": "512MiB"}), SandboxSpec)
    assert isinstance(validated(tmp_path, {"memory": "512MiB"}), StoredSpec)
