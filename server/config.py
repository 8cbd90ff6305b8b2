"""Settings (DESIGN §9): a flag, then `PALAESTRA_<NAME>`, then `palaestra.toml`, then default."""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from palaestra.sandbox.base import default_cache
from palaestra.sandbox.docker.engine import BASE_IMAGE
from palaestra.sandbox.egress import DEFAULT_ALLOW, AllowList, parse_reachable
from palaestra.server import family_slices
from palaestra.server.db import Database, redact
from palaestra.shipped import shipped_dir

REPO_PACKS = shipped_dir("packs")  # the built-in packs: in the wheel, or the checkout's
REPO_IMAGES = shipped_dir("images")  # the image recipes, likewise
BUILT_IMAGES = ("base", "cad", "coding", "terminal")  # images/ when the tree is not at hand


def default_images() -> list[str]:
    """The image recipes the project builds (images/<name>/Dockerfile or build.sh)."""
    if not REPO_IMAGES.is_dir():
        return list(BUILT_IMAGES)
    return sorted(
        d.name
        for d in REPO_IMAGES.iterdir()
        if (d / "Dockerfile").is_file() or (d / "build.sh").is_file()
    )


# Base images real Terminal-Bench / Harbor tasks use -> the stand-ins under images/.
DEFAULT_IMAGE_ALIASES = {
    **{
        name: "palaestra/python:latest"
        for name in (
            "python", "python:3", "python:3-slim", "python:latest", "python:slim",
            *(f"python:3.{minor}{v}" for minor in range(8, 15) for v in ("", "-slim",
              "-slim-bookworm", "-bookworm", "-slim-bullseye", "-bullseye")),
            "ghcr.io/laude-institute/t-bench/python-3-13",
        )
    },
    **{
        name: "palaestra/ubuntu:latest"
        for name in (
            "ubuntu", "ubuntu:latest", "ubuntu:20.04", "ubuntu:22.04", "ubuntu:24.04",
            "debian", "debian:bookworm", "debian:bookworm-slim", "debian:12", "debian:12-slim",
            "debian:stable-slim", "buildpack-deps", "buildpack-deps:jammy",
            "buildpack-deps:bookworm", "ghcr.io/laude-institute/t-bench/ubuntu-24-04",
            "ghcr.io/laude-institute/t-bench/base",
        )
    },
}  # fmt: skip


def default_data_dir() -> Path:
    """Where a server keeps its store, packs and tokens when no `data_dir` is set: the XDG
    data home's default, ~/.local/share/palaestra (never the current directory)."""
    return Path.home() / ".local" / "share" / "palaestra"


def _host_ca() -> Path | None:
    path = Path("/etc/ssl/certs/ca-certificates.crt")
    return path if path.is_file() else None


JUDGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class JudgeEndpointSettings(BaseModel):
    """One judge endpoint (`judges.<name>`): any OpenAI-compatible /chat/completions, with
    the limits every episode on this server shares (verifiers/judge_endpoint.py)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        description="the OpenAI base URL, http(s)://HOST[:PORT]/v1 (or the full …/chat/completions)"
    )
    model: str = Field(min_length=1, description="the model the endpoint is asked for")
    api_key: SecretStr | None = Field(default=None, description="sent as a bearer token")
    max_concurrency: int = Field(
        default=16, ge=1, le=4096, description="requests in flight at most (per server process)"
    )
    deadline_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="one judge call at most, queueing, cool-downs and retries included",
    )
    max_retries: int = Field(default=4, ge=0, le=100, description="retries of one call at most")
    retry_ratio: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="retries at most this share of the last minute's calls (plus retry_floor)",
    )
    retry_floor: int = Field(
        default=10, ge=0, description="retries a quiet endpoint may make in a minute anyway"
    )
    timeout_s: float = Field(
        default=60.0, gt=0, allow_inf_nan=False, description="one HTTP request at most"
    )
    retry_after_cap_s: float = Field(
        default=60.0, gt=0, allow_inf_nan=False, description="a Retry-After is honoured up to it"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{value!r} is no endpoint URL: write http(s)://HOST[:PORT]/v1, the "
                "OpenAI base URL of the judge server"
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("write the URL without query, fragment or user info (the key "
                             "goes in api_key)")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _timeout_fits(self) -> JudgeEndpointSettings:
        if self.timeout_s > self.deadline_s:
            raise ValueError("timeout_s (one request) must be at most deadline_s (the call)")
        return self

    @field_serializer("api_key", when_used="json")
    def _key_shown(self, value: SecretStr | None, info: FieldSerializationInfo) -> str | None:
        """Masked, except for the settings a cluster front hands its workers."""
        if value is None:
            return None
        reveal = isinstance(info.context, dict) and info.context.get("secrets") is True
        return value.get_secret_value() if reveal else "**********"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(
        default_factory=lambda: default_data_dir(),
        description="SQLite store, packs, tokens (default ~/.local/share/palaestra)",
    )
    store: str = Field(
        default="",
        description=(
            "the database: '' for SQLite in the data dir, sqlite://PATH, or "
            "postgresql://USER:PASSWORD@HOST:PORT/DB (shared by several servers)"
        ),
    )
    heldout_secret_file: Path | None = Field(
        default=None,
        description=(
            "the secret sealed generated tasks derive their seeds from (made 0600 at first "
            "start; default <data_dir>/heldout.secret); share it to share a held-out set"
        ),
    )
    # The CLI's side: the server its commands talk to (cli/options.py).
    url: str | None = Field(
        default=None, description="CLI: the server URL; without it an embedded server runs"
    )
    token: SecretStr | None = Field(default=None, description="CLI: the bearer token it sends")
    host: str = "127.0.0.1"
    port: int = 8000
    sandbox: str = Field(default="bwrap", description="sandbox backend")
    cache: Path = Field(
        default_factory=lambda: default_cache(),
        description=(
            "cache folder: the exec helper's build, image rootfs folders, docker's bash, "
            "generated tasks and finance reports"
        ),
    )
    toolchains_dir: Path | None = Field(
        default=None,
        description=(
            "cad toolchains (scripts/bootstrap-cad.sh; default /opt/palaestra/toolchains "
            "where it exists, else .toolchains in the checkout)"
        ),
    )
    images_dir: Path | None = Field(
        default=None,
        description="bwrap image rootfs folders <name>/rootfs (default <cache>/images)",
    )
    exec_helper: bool = Field(
        default=True, description="bwrap: start jails through the exec helper (built on first use)"
    )
    docker_image: str = Field(
        default=BASE_IMAGE, description="docker: the image of a spec without one"
    )
    forkserver: bool = Field(
        default=True,
        description="bwrap: one-shot Python runs in a fork server (false: a fresh sandbox each)",
    )
    e2b_api_key: SecretStr | None = Field(
        default=None, description="e2b backend: the API key (also read from E2B_API_KEY)"
    )
    pool_size: int = Field(
        default=4, ge=0, description="warm sandboxes kept ready per sandbox spec (0: no pool)"
    )
    pool_max_total: int = Field(default=64, ge=1, description="warm sandboxes over all specs")
    packs_dirs: list[Path] = Field(default_factory=lambda: [REPO_PACKS])
    background_warm: bool = Field(
        default=True,
        description="serve and run: packs whose generated tasks are not cached yet are "
        "generated in a background process while the others are served (/readyz lists them "
        "as warming); false: generated before the server answers",
    )
    max_episodes: int = Field(default=2048, ge=1, description="live episodes before 429")
    # Per-token quotas (server/tenancy.py): the defaults for tokens made without their own;
    # admin tokens are bound only by a quota set on them. None: no cap.
    token_max_live: int | None = Field(
        default=1024, ge=0, description="live episodes per token (default quota)"
    )
    token_max_episodes_per_hour: int | None = Field(
        default=None, ge=0, description="episode starts per token per hour (default quota)"
    )
    token_max_cpu_s_per_hour: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="sandbox CPU-seconds per token per hour (default quota)",
    )
    token_max_pending: int = Field(
        default=256,
        ge=1,
        description="detached batch steps (answered still_running) per token before 429",
    )
    idle_ttl_s: float = Field(default=900.0, gt=0, description="idle episodes expire after this")
    reaper_interval_s: float = Field(default=5.0, gt=0)
    mcp_sessions_per_token: int = Field(
        default=64,
        ge=1,
        description="open MCP sessions per token (/v1/episodes/{id}/mcp); a new one past it "
        "ends the token's least recently used",
    )
    max_steps: int = Field(default=50, ge=1, description="default step limit per episode")
    max_wall_s: float = Field(default=1800.0, gt=0, description="default wall-time limit")
    # Operator ceilings (server/ceilings.py): the most any client option or task field may ask
    # for; over one is a 422 naming the limit and the ceiling.
    ceiling_steps: int = Field(default=10_000, ge=1, description="options.max_steps at most")
    ceiling_wall_s: float = Field(
        default=4 * 3600.0, gt=0, allow_inf_nan=False, description="options.max_wall_s at most"
    )
    ceiling_step_timeout_s: float = Field(
        default=600.0, gt=0, allow_inf_nan=False, description="options.step_timeout_s at most"
    )
    ceiling_output_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1, description="options.max_output_bytes (one step) at most"
    )
    ceiling_episode_output_bytes: int = Field(
        default=1 << 30, ge=1, description="options.max_episode_output_bytes at most"
    )
    ceiling_memory_mb: int = Field(default=16_384, ge=1, description="a sandbox's memory_mb")
    ceiling_cpus: float = Field(
        default=4.0, gt=0, allow_inf_nan=False, description="a sandbox's cpus"
    )
    ceiling_pids: int = Field(default=4096, ge=1, description="a sandbox's pids")
    ceiling_workspace_mb: int = Field(default=8192, ge=1, description="a sandbox's workspace_mb")
    ceiling_task_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        allow_inf_nan=False,
        description="a task's timeout_s, setup_timeout_s, verifier_timeout_s and exec timeouts",
    )
    allow_oracle: bool = Field(
        default=True, description="let clients drive an episode with the task's oracle"
    )
    auth: Literal["token", "off"] = Field(
        default="token",
        description=(
            "token: every /v1 request needs a bearer token with the right scope; "
            "off: everyone is admin (local experiments only, never on a shared network)"
        ),
    )
    max_pack_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1, description="largest pack archive POST /v1/packs takes"
    )
    # What one request may cost the server (docs/security.md, tests/redteam/).
    max_pack_unpacked_bytes: int = Field(
        default=2 * 1024**3, ge=1, description="a pack archive's uncompressed total (413 over)"
    )
    max_pack_files: int = Field(default=200_000, ge=1, description="entries in a pack archive")
    max_pack_ratio: float = Field(
        default=200.0, gt=1, allow_inf_nan=False, description="uncompressed/compressed bytes"
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="largest JSON request body (413 over)"
    )
    max_json_depth: int = Field(
        default=64, ge=2, le=200, description="deepest nesting of a JSON request body (422)"
    )
    max_batch_items: int = Field(
        default=1024, ge=1, le=1024, description="items in one batch call (413 over)"
    )
    max_connections: int = Field(
        default=4096, ge=16, description="open connections and tasks before 503 (uvicorn)"
    )
    max_header_bytes: int = Field(
        default=64 * 1024, ge=4096, description="request line and headers of one request"
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, allow_inf_nan=False, description="to send a request's headers"
    )
    keep_alive_s: float = Field(
        default=5.0, gt=0, allow_inf_nan=False, description="idle keep-alive connection life"
    )
    shutdown_grace_s: float = Field(
        default=20.0,
        ge=0,
        allow_inf_nan=False,
        description="on SIGTERM, how long running requests may finish before the rest are void",
    )
    # Trust boundaries for published packs (docs/security.md): what a task may name, who owns
    # an org, how much one publisher may store.
    images: list[str] = Field(
        default_factory=lambda: default_images(),
        description="image names a task's `image` may use (default: the recipes under images/)",
    )
    image_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_IMAGE_ALIASES),
        description=(
            "task environment builds: base image -> local image, for FROM lines (a key "
            "without a tag matches every tag); toml table [image_aliases]"
        ),
    )
    env_build_timeout_s: float = Field(
        default=1800.0, gt=0, allow_inf_nan=False, description="one environment image's build"
    )
    env_context_max_mb: int = Field(
        default=64, ge=1, description="a task environment's build context at most"
    )
    build_ca_file: Path | None = Field(
        default_factory=lambda: _host_ca(),
        description=(
            "trust store copied into the stand-in base images (a TLS proxy to the package "
            "registry); default the host's /etc/ssl/certs/ca-certificates.crt"
        ),
    )
    toolchains: list[str] = Field(
        default_factory=lambda: ["trimesh", "blender"],
        description="toolchain names a task's `toolchain` may use",
    )
    builtin_orgs: list[str] = Field(
        default_factory=lambda: ["palaestra", "openai", "reasoning"],
        description="pack orgs only an admin token may publish into",
    )
    publisher_max_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=0, description="installed bytes one publisher may store"
    )
    publisher_max_versions: int = Field(
        default=200, ge=0, description="pack versions one publisher may publish"
    )
    publish_check_tasks: int = Field(
        default=4,
        ge=0,
        description="tasks of a new pack version the family's cheats and the generic cheat "
        "library are played on before it is published; any cheat above the pack's "
        "cheat_max_reward refuses it (0: no audit)",
    )
    # A publish token's generator pack runs its generators in a sandbox at publish time,
    # one fresh sandbox per generator and split (server/packs/generate.py).
    generate_timeout_s: float = Field(
        default=120.0, gt=0, allow_inf_nan=False, description="one generator split's run"
    )
    generate_memory_mb: int = Field(
        default=1024, ge=64, description="memory of one generator split's sandbox"
    )
    generate_max_output_mb: int = Field(
        default=16, ge=1, description="the tasks one generator split may print, at most"
    )
    generate_pids: int = Field(
        default=64, ge=4, description="processes one generator split's sandbox may hold"
    )
    # Egress of tasks that declare internet access (docs/security.md "Network").
    egress_allow: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOW),
        description=(
            "hosts a sandbox with internet access may reach through the egress proxy:"
            " host, *.domain, either with :port (default ports 80, 443); [] for none"
        ),
    )
    egress_private: list[str] = Field(
        default_factory=list,
        description=(
            "ip:port of a mirror on a private address the egress proxy may connect to"
            " (its name still must be on egress_allow)"
        ),
    )
    # Harness mode (server/harness/, docs/harness.md): what a reset's options["harness"] may
    # name and ask for.
    harness_endpoints: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "localhost", "::1"],
        description=(
            "hosts (host or host:port) a harness episode's model_endpoint may name; "
            "default loopback only"
        ),
    )
    harness_max_calls: int = Field(
        default=64, ge=1, description="model calls of a harness episode without max_calls"
    )
    ceiling_harness_calls: int = Field(
        default=1024, ge=1, description="options.harness.max_calls at most"
    )
    harness_max_tokens: int = Field(
        default=65_536, ge=1, description="completion tokens of a harness episode by default"
    )
    ceiling_harness_tokens: int = Field(
        default=4_000_000, ge=1, description="options.harness.max_tokens at most"
    )
    harness_probe_timeout_s: float = Field(
        default=5.0,
        gt=0,
        allow_inf_nan=False,
        description="how long reset waits for a harness model endpoint's GET /models",
    )
    # The sampler (docs/sampler.md): mixture, curriculum, quarantine.
    sampler_weights: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description=(
            "mixture weights by pack name ('openai/humaneval') or domain prefix "
            "('reasoning/arc_1d'); default 1; env: JSON or 'key=w,key=w'"
        ),
    )
    sampler_curriculum: bool = Field(
        default=True, description="weight tasks by their running success rate (frontier first)"
    )
    sampler_alpha: float = Field(
        default=2.0, ge=0, description="curriculum sharpness: w = floor + (1-floor)(4p(1-p))^alpha"
    )
    sampler_floor: float = Field(
        default=0.05, gt=0, le=1, description="curriculum weight of a solved/unsolvable task"
    )
    sampler_window: int = Field(
        default=32, ge=1, description="verified episodes per task in its running success rate"
    )
    sampler_void_window: int = Field(default=5, ge=1, description="episodes watched for voids")
    sampler_void_limit: int = Field(
        default=3, ge=1, description="voids among the last sampler_void_window that quarantine"
    )
    sampler_quarantine_s: float = Field(
        default=3600.0, ge=0, description="quarantine cool-down (0: until an admin releases it)"
    )
    sampler_history: int = Field(
        default=100_000, ge=0, description="recent episodes read at start to rebuild the stats"
    )
    # Judges (verifiers/judge_endpoint.py, docs/reference/judges.md "Endpoint operations").
    judges: dict[str, JudgeEndpointSettings] = Field(
        default_factory=dict,
        description=(
            "judge endpoints by name, which a family's verifier asks for (ctx.judges); "
            "toml [judges.NAME] url, model, api_key, …; env: JSON"
        ),
    )
    families: family_slices.FamilySlices = Field(
        default_factory=dict, description=family_slices.HELP
    )
    judge_cache_entries: int = Field(
        default=10_000, ge=1, description="judgements kept in memory (least recently used go)"
    )
    log_level: str = "info"
    # Cluster mode (server/cluster/, docs/operations.md).
    ray: str = Field(
        default="",
        description=(
            "run episodes on Ray workers: a cluster address (host:port), 'auto', or 'local:N' "
            "(start an N-node cluster on this machine); empty: embedded, in this process"
        ),
    )
    ray_namespace: str = Field(default="palaestra", description="Ray namespace of the workers")
    ray_node_episodes: int = Field(
        default=0,
        ge=0,
        description=(
            "live episodes a worker hosts (a node's `palaestra_episodes` resource overrides "
            "it; 0: max_episodes)"
        ),
    )
    ray_overcommit: float = Field(
        default=4.0,
        gt=0,
        description="sandbox CPUs and memory a node may promise, as a multiple of what it has",
    )
    ray_poll_s: float = Field(
        default=1.0, gt=0, description="how often a front refreshes workers' load and health"
    )
    ray_local_cpus: int = Field(default=1, ge=1, description="local:N: CPUs each node declares")
    ray_metrics_timeout_s: float = Field(
        default=2.0, gt=0, description="how long a front's /metrics waits for each worker's"
    )
    # Harness mode (server/harness/): the session model proxy.
    llm_call_timeout_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="one model call through the session proxy, upstream included (void past it)",
    )
    llm_max_request_kb: int = Field(
        default=8192, ge=1, description="a harness's model call body at most, KiB (413 over)"
    )
    llm_max_response_kb: int = Field(
        default=32768, ge=1, description="an upstream model reply at most, KiB (void over)"
    )
    # Group rewards (server/groups.py): POST /v1/groups/verify.
    max_group_size: int = Field(
        default=16,
        ge=2,
        le=1024,
        description="episodes one group verify may judge together (422 over; a tournament's "
        "judge calls grow with its square; the judge's own MAX_GROUP caps it too)",
    )

    @field_validator("egress_allow")
    @classmethod
    def _egress_rules(cls, value: list[str]) -> list[str]:
        AllowList.parse(value)
        return value

    @field_validator("judges")
    @classmethod
    def _judge_names(
        cls, value: dict[str, JudgeEndpointSettings]
    ) -> dict[str, JudgeEndpointSettings]:
        for name in value:
            if not JUDGE_NAME.fullmatch(name):
                raise ValueError(
                    f"judge name {name!r}: letters, digits, '_', '.', '-', at most 64, "
                    "starting with a letter or digit"
                )
        return value

    @field_validator("egress_private")
    @classmethod
    def _egress_pairs(cls, value: list[str]) -> list[str]:
        parse_reachable(value)
        return value

    @model_validator(mode="after")
    def _void_limit_fits(self) -> Settings:
        if self.sampler_void_limit > self.sampler_void_window:
            raise ValueError("sampler_void_limit must be at most sampler_void_window")
        if self.max_steps > self.ceiling_steps or self.max_wall_s > self.ceiling_wall_s:
            raise ValueError("max_steps and max_wall_s must be within ceiling_steps/ceiling_wall_s")
        if (
            self.harness_max_calls > self.ceiling_harness_calls
            or self.harness_max_tokens > self.ceiling_harness_tokens
        ):
            raise ValueError(
                "harness_max_calls and harness_max_tokens must be within their ceilings"
            )
        return self

    @field_serializer("store", when_used="json")
    def _store_shown(self, value: str) -> str:
        return redact(value)  # `palaestra config` never prints a password

    def database(self) -> Database:
        """Open (and migrate) the `store`; the caller closes it (a Store closes its own).
        StoreUnavailableError names the URL and what to fix."""
        return Database.open(self.store or self.data_dir / "palaestra.sqlite3")


def _coerce(name: str, raw: str) -> Any:
    if name == "packs_dirs":
        return [p for p in raw.split(os.pathsep) if p]
    if name in ("images", "toolchains", "builtin_orgs", "harness_endpoints"):
        return [p.strip() for p in raw.split(",") if p.strip()]
    if name == "families":
        return family_slices.from_json(raw)
    if name == "judges":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"PALAESTRA_JUDGES is not JSON ({exc}): write "
                '{"NAME": {"url": "http://HOST:PORT/v1", "model": "MODEL"}}'
            ) from None
    if name in ("sampler_weights", "image_aliases"):
        if raw.lstrip().startswith("{"):
            return json.loads(raw)
        pairs = (item.rsplit("=", 1) for item in raw.split(",") if item.strip())
        return {key.strip(): value.strip() for key, value in pairs}
    return raw


# Environment variables read beside PALAESTRA_<NAME> (the name a third party documents).
ALSO_FROM_ENV = {"e2b_api_key": "E2B_API_KEY"}


def env_names(name: str) -> list[str]:
    """The environment variables a setting is read from, first first."""
    return [f"PALAESTRA_{name.upper()}", *([ALSO_FROM_ENV[name]] if name in ALSO_FROM_ENV else [])]


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the four sources; unknown keys in palaestra.toml are an error that names them."""
    return load_settings_with_sources(flags, environ=environ, config_file=config_file)[0]


def load_settings_with_sources(
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> tuple[Settings, dict[str, str]]:
    """The settings and where each came from: `flag`, the environment variable's name,
    the config file's path, or `default`."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config_file or Path(environ.get("PALAESTRA_CONFIG", "palaestra.toml"))
    if path.exists():
        values.update(tomllib.loads(path.read_text(encoding="utf-8")))
        sources.update(dict.fromkeys(values, str(path)))
    for name in Settings.model_fields:
        for var in env_names(name):
            env_value = environ.get(var)
            if env_value is not None:
                values[name] = _coerce(name, env_value)
                sources[name] = var
                break
    family_vars = {k: v for k, v in environ.items() if k.startswith(family_slices.FAMILY_ENV)}
    if family_vars:  # PALAESTRA_FAMILY_<NAME>__<FIELD>: one field of a family, over the rest
        values["families"] = family_slices.with_variables(values.get("families"), family_vars)
        sources["families"] = family_slices.source(sources.get("families"), family_vars)
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    values.update(given)
    sources.update(dict.fromkeys(given, "flag"))
    settings = Settings.model_validate(values)
    return settings, {name: sources.get(name, "default") for name in Settings.model_fields}
