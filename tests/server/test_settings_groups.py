"""Settings are declared by concern (server/settings/) and composed into one flat model: every
field in exactly one group, validators kept, JSON dumps round-trip (the cluster's workers get
their settings that way), secrets still masked."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from palaestra.server.cluster.worker import settings_for_workers
from palaestra.server.config import (
    GROUPS,
    Settings,
    _coerce,
    _container,
    load_settings_with_sources,
)


def test_every_field_is_in_exactly_one_group() -> None:
    listed = [name for names in Settings.groups().values() for name in names]
    assert len(listed) == len(set(listed))
    assert set(listed) == set(Settings.model_fields)
    assert list(Settings.groups()) == list(GROUPS)


def test_every_group_says_its_concern_and_is_a_base_of_settings() -> None:
    for name, group in GROUPS.items():
        assert group.__doc__ and group.__doc__.strip(), name
        assert issubclass(Settings, group), name
        assert group.model_config.get("extra") == "forbid", name


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sampler_void_limit": 9}, "sampler_void_limit must be at most sampler_void_window"),
        ({"max_steps": 20_000}, "max_steps and max_wall_s must be within"),
        ({"harness_max_calls": 5000}, "harness_max_calls and harness_max_tokens must be within"),
        ({"egress_allow": ["bad host!"]}, "is not a host name"),
        ({"judges": {"-x": {"url": "http://h/v1", "model": "m"}}}, "judge name '-x'"),
        ({"no_such_setting": 1}, "Extra inputs are not permitted"),
    ],
)
def test_validators_of_each_group_still_run(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings.model_validate(values)


def test_json_round_trips_for_the_workers() -> None:
    settings = Settings(
        data_dir=Path("/srv/palaestra"),
        store="postgresql://u:pw@db:5432/gym",
        token=SecretStr("cli-token"),
        e2b_api_key=SecretStr("e2b-key"),
        judges={"j": {"url": "http://judge:8000/v1", "model": "m", "api_key": "judge-key"}},
        families={"finance": {"memory_documents": 3}},
        sampler_weights={"openai/humaneval": 2.0},
        pool_size=2,
        max_steps=7,
        ray="local:2",
    )
    assert Settings.model_validate_json(Settings().model_dump_json()) == Settings()
    shown = settings.model_dump_json()
    for secret in ("pw", "cli-token", "e2b-key", "judge-key"):
        assert secret not in shown
    sent = settings_for_workers(settings)
    back = Settings.model_validate_json(sent)
    assert back.judges["j"].api_key is not None
    assert back.judges["j"].api_key.get_secret_value() == "judge-key"  # workers call judges
    # ...and a shared database and the e2b backend: the password and key as they are
    assert back.store == settings.store and "pw" in back.store
    assert back.e2b_api_key is not None and back.e2b_api_key.get_secret_value() == "e2b-key"
    assert back.model_dump_json(context={"secrets": True}) == sent  # a stable round trip
    assert (back.pool_size, back.max_steps, back.ray) == (2, 7, "local:2")
    assert back.families == {"finance": {"memory_documents": 3}}


def test_the_loader_still_fills_every_group(tmp_path: Path) -> None:
    config = tmp_path / "palaestra.toml"
    config.write_text('sandbox = "docker"\nsampler_alpha = 3.0\n[judges.j]\nurl = "http://h/v1"\n'
                      'model = "m"\n')  # fmt: skip
    environ = {"PALAESTRA_RAY_POLL_S": "2.5", "PALAESTRA_PUBLISHER_MAX_VERSIONS": "9"}
    settings, sources = load_settings_with_sources(
        {"port": 9001}, environ=environ, config_file=config
    )
    assert (settings.sandbox, settings.sampler_alpha, settings.port) == ("docker", 3.0, 9001)
    assert (settings.ray_poll_s, settings.publisher_max_versions) == (2.5, 9)
    assert sources["judges"] == str(config) and sources["ray_poll_s"] == "PALAESTRA_RAY_POLL_S"


def test_every_list_and_mapping_setting_reads_its_environment_variable() -> None:
    """PALAESTRA_EGRESS_ALLOW=pypi.org,files.pythonhosted.org was refused as "not a valid
    list": only a hand-kept set of names was split. Every list and mapping setting now takes
    JSON or the comma form from its variable, whatever its name."""
    lists = maps = 0
    for name, field in Settings.model_fields.items():
        if name in ("packs_dirs", "families", "judges"):  # forms of their own, tested apart
            continue
        shape = _container(field.annotation)
        if shape is list:
            lists += 1
            assert _coerce(name, "a, b") == ["a", "b"] == _coerce(name, '["a", "b"]'), name
        elif shape is dict:
            maps += 1
            assert _coerce(name, "a=1,b=2") == {"a": "1", "b": "2"}, name
            assert _coerce(name, '{"a": 1}') == {"a": 1}, name
    assert lists >= 5 and maps >= 2
    for text in ("pypi.org, files.pythonhosted.org", '["pypi.org", "files.pythonhosted.org"]'):
        environ = {"PALAESTRA_EGRESS_ALLOW": text}
        settings, sources = load_settings_with_sources(environ=environ)
        assert settings.egress_allow == ["pypi.org", "files.pythonhosted.org"]
        assert sources["egress_allow"] == "PALAESTRA_EGRESS_ALLOW"
    with pytest.raises(ValueError, match="PALAESTRA_EGRESS_ALLOW is not JSON"):
        load_settings_with_sources(environ={"PALAESTRA_EGRESS_ALLOW": "[pypi.org"})
