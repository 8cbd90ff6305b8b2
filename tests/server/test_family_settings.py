"""A family's own settings (issue 33, item 4): a family declares `settings_model`, the
server builds it from the family's slice of `Settings.families` (palaestra.toml
`[families.<name>]`, `PALAESTRA_FAMILY_<NAME>__<FIELD>`, `PALAESTRA_FAMILIES`) and hands it
with the server's folders (`ServerPaths`); the runtime names no family."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from palaestra.envs import (
    Action,
    Assessment,
    EpisodeContext,
    Family,
    FamilySettings,
    Observation,
    PrivateFields,
    PublicFields,
    ServerPaths,
    StepOutcome,
    Task,
    tool,
)
from palaestra.envs.cad import CadFamily
from palaestra.envs.commentary import CommentaryFamily
from palaestra.envs.echo import EchoFamily
from palaestra.envs.finance import FinanceFamily, FinanceSettings
from palaestra.server import families as registry_module
from palaestra.server.config import Settings, load_settings, load_settings_with_sources
from palaestra.server.families import FamilyRegistry, FamilySettingsError, make_family


class GreetSettings(FamilySettings):
    greeting: str = Field(default="hello", min_length=1)
    repeat: int = Field(default=1, ge=1, le=5)


class GreetFamily(Family):
    name = "greet-test"
    description = "Says its greeting."
    public_fields = PublicFields
    private_fields = PrivateFields
    settings_model = GreetSettings
    settings: GreetSettings

    async def reset(self, ctx: EpisodeContext) -> Observation:
        return Observation(text=" ".join([self.settings.greeting] * self.settings.repeat))

    @tool("End.")
    async def submit(self, ctx: EpisodeContext) -> StepOutcome:
        return StepOutcome(Observation(text="bye"), done=True)

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        return Assessment(reward=0.0, passed=False)

    def oracle(self, task: Task) -> list[Action]:
        return [Action(tool="submit")]


@pytest.fixture
def with_greet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "BUILTIN", (*registry_module.BUILTIN, GreetFamily))


def settings_of(tmp_path: Path, toml: str = "", environ: dict[str, str] | None = None) -> Settings:
    config = tmp_path / "palaestra.toml"
    config.write_text(toml)
    return load_settings(environ=environ or {}, config_file=config)


def test_a_family_declaring_settings_gets_its_slice(tmp_path: Path, with_greet: None) -> None:
    settings = settings_of(
        tmp_path,
        '[families.greet-test]\ngreeting = "ahoy"\nrepeat = 2\n',
        {"PALAESTRA_FAMILY_GREET_TEST__REPEAT": "3"},  # the environment over the file
    )
    family = FamilyRegistry.discover(settings).get("greet-test")
    assert isinstance(family, GreetFamily)
    assert family.settings == GreetSettings(greeting="ahoy", repeat=3)
    assert family.server == ServerPaths(cache=settings.cache, toolchains=settings.toolchains_dir)
    # the other families keep their defaults
    assert FamilyRegistry.discover(Settings()).get("greet-test").settings == GreetSettings()


def test_the_built_in_families_read_their_slices_and_the_server_folders(tmp_path: Path) -> None:
    settings = settings_of(
        tmp_path,
        "[families.finance]\nmemory_documents = 4\n",
        {
            "PALAESTRA_CACHE": str(tmp_path / "cache"),
            "PALAESTRA_TOOLCHAINS_DIR": str(tmp_path / "chains"),  # the server-wide setting
            "PALAESTRA_FAMILY_FINANCE_COMMENTARY__JUDGE": "grader",
        },
    )
    registry = FamilyRegistry.discover(settings)
    finance = registry.get("finance")
    assert isinstance(finance, FinanceFamily)
    assert finance.settings == FinanceSettings(memory_documents=4)
    assert finance._dir() == tmp_path / "cache" / "finance"
    commentary = registry.get("finance-commentary")
    assert isinstance(commentary, CommentaryFamily)
    assert commentary.judges() == frozenset({"grader"})
    assert commentary.documents._dir() == tmp_path / "cache" / "finance"  # finance's reports
    cad = registry.get("cad")
    assert isinstance(cad, CadFamily) and cad.server.toolchains == tmp_path / "chains"


def test_where_a_family_setting_came_from(tmp_path: Path) -> None:
    config = tmp_path / "palaestra.toml"
    config.write_text("[families.finance]\nmemory_documents = 4\n")
    environ = {"PALAESTRA_FAMILY_FINANCE__CACHE_DIR": str(tmp_path / "reports")}
    settings, sources = load_settings_with_sources(environ=environ, config_file=config)
    assert settings.families == {
        "finance": {"memory_documents": 4, "cache_dir": str(tmp_path / "reports")}
    }
    assert sources["families"] == f"{config}, PALAESTRA_FAMILY_FINANCE__CACHE_DIR"
    whole = load_settings(
        environ={"PALAESTRA_FAMILIES": '{"finance": {"memory_documents": 2}}'},
        config_file=tmp_path / "none.toml",
    )
    assert whole.families == {"finance": {"memory_documents": 2}}


def test_a_bad_family_setting_names_the_family_and_the_field(
    tmp_path: Path, with_greet: None
) -> None:
    bad = settings_of(tmp_path, "[families.greet-test]\nrepeat = 9\n")
    with pytest.raises(FamilySettingsError) as info:
        FamilyRegistry.discover(bad)
    message = str(info.value)
    assert message.startswith("family greet-test: setting repeat: ")
    assert "less than or equal to 5" in message
    assert "[families.greet-test] repeat or PALAESTRA_FAMILY_GREET_TEST__REPEAT" in message

    env = settings_of(tmp_path, environ={"PALAESTRA_FAMILY_FINANCE__MEMORY_DOCUMENTS": "none"})
    with pytest.raises(FamilySettingsError, match="family finance: setting memory_documents: "):
        FamilyRegistry.discover(env)

    typo = settings_of(tmp_path, "[families.finance]\ncache_dri = '/tmp/x'\n")
    with pytest.raises(FamilySettingsError) as info:
        FamilyRegistry.discover(typo)
    assert "family finance: setting cache_dri: no such setting" in str(info.value)
    assert "its settings: cache_dir, memory_documents" in str(info.value)

    nobody = settings_of(tmp_path, "[families.finanse]\ncache_dir = '/tmp/x'\n")
    with pytest.raises(FamilySettingsError, match="family finanse, which is not installed"):
        FamilyRegistry.discover(nobody)


def test_a_family_setting_variable_must_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PALAESTRA_FAMILY_<NAME>__<FIELD>"):
        settings_of(tmp_path, environ={"PALAESTRA_FAMILY_FINANCE_CACHE_DIR": "/tmp/x"})
    with pytest.raises(ValueError, match="name the same family"):
        Settings(families={"finance-commentary": {}, "finance_commentary": {}})


def test_a_family_made_without_the_server_has_its_defaults() -> None:
    assert FinanceFamily().settings == FinanceSettings()
    assert FinanceFamily().server == ServerPaths()
    assert EchoFamily().settings == FamilySettings()
    with pytest.raises(TypeError, match="FinanceSettings, not a GreetSettings"):
        FinanceFamily(GreetSettings())


def test_a_family_whose_init_takes_no_settings_is_made_as_before() -> None:
    """Written before family settings: made with no arguments, then handed both."""

    class OldGreet(GreetFamily):
        def __init__(self) -> None:
            self.made = True

    server = ServerPaths(cache=Path("/srv/cache"))
    family = make_family(OldGreet, GreetSettings(repeat=2), server)
    assert isinstance(family, OldGreet) and family.made
    assert family.settings == GreetSettings(repeat=2) and family.server is server
