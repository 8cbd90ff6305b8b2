"""Nothing a published task says can name a host path (DESIGN §5b, issue 14 invariant 1).

Before: a task's public `image` went straight to SandboxSpec.image, and the bwrap backend
took an absolute path as a rootfs, so `"image": "/"` bound the host's root into the
sandbox (every sealed verifier, the SQLite store, the admin token). Now a task field that
names a path, `..` or an unknown image is refused at publish and at load, naming the pack,
the task and the field; and the backends refuse such a spec even if one reaches them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import docker_skip_reason, make_settings

from palaestra.sandbox import SandboxSpec, SandboxSpecError
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.loader import load_pack
from palaestra.server.packs.manifest import PackError
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.packs.taskfields import HostPolicy
from tests.hosts import local_host

from .publishers import archive, client, error, publish, write_pack


def terminal_task(**public: Any) -> dict[str, Any]:
    return {
        "id": "attack",
        "family": "terminal",
        "split": "train",
        "public": {"instruction": "Look around.", **public},
        "private": {"verifier": {"test.sh": "exit 0\n"}},
    }


# (public fields, private fields, the field the refusal must name)
ATTACKS: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    ({"image": "/"}, {}, "public.image"),
    ({"image": "../../"}, {}, "public.image"),
    ({"image": "/root/.palaestra"}, {}, "public.image"),
    ({"image": "python:3.11"}, {}, "public.image"),  # a docker name not in the registry
    ({"image": "evil/rootkit:latest"}, {}, "public.image"),
    ({"image": ["terminal"]}, {}, "public.image"),
    ({"workdir": "/.."}, {}, "public.workdir"),
    ({"workdir": "/"}, {}, "public.workdir"),
    ({"workdir": "/work/../.."}, {}, "public.workdir"),
    ({"workdir": "work"}, {}, "public.workdir"),
    ({"workdir": "/proc/self"}, {}, "public.workdir"),
    ({"workdir": "/usr/lib"}, {}, "public.workdir"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, {}, "public.env"),
    ({"ro_binds": [["/", "/host"]]}, {}, "public.ro_binds"),
    ({"mounts": ["/root/.palaestra:/data"]}, {}, "public.mounts"),
    ({}, {"ro_binds": [["/root/.palaestra", "/opt/x"]]}, "private.ro_binds"),
    ({"toolchain": "/usr/lib/blender"}, {}, "public.toolchain"),
    ({"toolchains": ["trimesh", "../../opt"]}, {}, "public.toolchains"),
    ({"environment": {"../../etc/cron.d/x": "* * * * * root id\n"}}, {}, "public.environment"),
    ({"environment": {"/etc/passwd": "root::0:0::/:/bin/sh\n"}}, {}, "public.environment"),
    ({}, {"verifier": {"../outside.sh": "exit 0\n"}}, "private.verifier"),
]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(data_dir=tmp_path / "data", pool_size=0)


@pytest.mark.slow
@pytest.mark.parametrize(("public", "private", "field"), ATTACKS)
async def test_publish_refuses_a_task_naming_the_host(
    manager: EpisodeManager,
    tmp_path: Path,
    public: dict[str, Any],
    private: dict[str, Any],
    field: str,
) -> None:
    task = terminal_task(**public)
    task["private"].update(private)
    async with client(manager, ["publish"], ("acme",)) as pub:
        reply = await publish(pub, archive(tmp_path, "acme/escape", tasks=[task]))
    status, code, message = error(reply)
    assert (status, code) == (400, "invalid_pack"), reply.text
    assert "pack acme/escape" in message and "task attack" in message and field in message
    assert "acme/escape" not in {p.name for p in manager.packs.all()}
    assert not list((manager.settings.data_dir / "packs" / "sha256").glob("*"))


@pytest.mark.parametrize(("public", "private", "field"), ATTACKS)
def test_load_refuses_a_task_naming_the_host(
    tmp_path: Path, public: dict[str, Any], private: dict[str, Any], field: str
) -> None:
    task = terminal_task(**public)
    task["private"].update(private)
    root = write_pack(tmp_path / "p", "acme/escape", tasks=[task])
    with pytest.raises(PackError, match=rf"pack acme/escape, task attack: {field}"):
        load_pack(root, ["terminal"])


def test_the_operators_images_are_accepted(tmp_path: Path) -> None:
    """The control: registry names and plain sandbox paths still load."""
    task = terminal_task(image="terminal", workdir="/app/src", env={"LANG": "C.UTF-8"})
    task["public"]["environment"] = {"setup.sh": "true\n", "src/a.py": "x = 1\n"}
    pack = load_pack(write_pack(tmp_path / "p", "acme/fine", tasks=[task]), ["terminal"])
    assert pack.tasks["attack"].public["image"] == "terminal"
    assert set(Settings().images) >= {"base", "cad", "coding", "terminal"}
    narrow = HostPolicy(images=frozenset({"coding"}), toolchains=frozenset())
    with pytest.raises(PackError, match="not an image this server has"):
        load_pack(write_pack(tmp_path / "q", "acme/fine", tasks=[task]), ["terminal"], narrow)


def test_a_stored_pack_that_names_the_host_is_refused_at_load(tmp_path: Path) -> None:
    """A pack installed under a wider policy (or before these checks) is not served."""
    settings = make_settings(data_dir=tmp_path / "data")
    registry = PackRegistry(settings.data_dir, settings.database())
    wide = HostPolicy(images=frozenset({"/"}), toolchains=frozenset())
    data = archive(tmp_path, "acme/old", tasks=[terminal_task(image="/")])
    registry.install(data, publisher="t", families=["terminal"], policy=wide)
    catalog = PackCatalog()
    assert registry.load_into(catalog, ["terminal"], HostPolicy.from_settings(settings)) == 0
    assert "acme/old" not in {p.name for p in catalog.all()}
    (why,) = catalog.errors.values()
    assert "public.image" in why and "task attack" in why


async def test_a_spec_naming_the_host_root_never_reaches_a_sandbox(
    manager: EpisodeManager, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """End to end: a task that slipped past the checks (added straight to the registry)
    still gets no sandbox over the host's root; the reset is refused."""
    wide = HostPolicy(images=frozenset({"/"}), toolchains=frozenset())
    root = write_pack(tmp_path / "p", "acme/slipped", tasks=[terminal_task(image="/")])
    manager.packs.add(load_pack(root, ["terminal"], wide))
    reply = await api.post("/v1/episodes", json={"task": "acme/slipped:attack"})
    assert reply.status_code != 200 and "outside the images dir" in reply.text, reply.text
    assert local_host(manager).sandboxes.backend.live_count == 0


# ---- the backends ---------------------------------------------------------------------------

# Each was taken before: a rootfs path anywhere (the host root has usr/), or a message that
# did not say why ("/root/.palaestra" failed only for having no usr/).
BWRAP_ATTACKS = ["/", "/root/.palaestra", "/etc", "/usr/..", "//", "/usr/../root/.."]


@pytest.mark.parametrize("image", BWRAP_ATTACKS)
async def test_bwrap_refuses_an_image_outside_the_images_dir(image: str) -> None:
    backend = BwrapBackend()
    try:
        with pytest.raises(SandboxSpecError, match="outside the images dir"):
            await backend.create(SandboxSpec(image=image))
        assert backend.live_count == 0
    finally:
        await backend.aclose()


async def test_bwrap_follows_symlinks_out_of_the_images_dir(tmp_path: Path) -> None:
    images = tmp_path / "images"
    (images / "evil").mkdir(parents=True)
    os.symlink("/", images / "evil" / "rootfs")  # a name that resolves to the host root
    os.symlink("/", images / "up")
    backend = BwrapBackend(images_dir=images)
    try:
        for image in ("evil", str(images / "evil" / "rootfs"), str(images / "up")):
            with pytest.raises(SandboxSpecError, match="outside the images dir"):
                await backend.create(SandboxSpec(image=image))
        with pytest.raises(SandboxSpecError, match="host root"):
            await backend.create(SandboxSpec(ro_binds=(("/", "/host"),)))
        assert backend.live_count == 0
    finally:
        await backend.aclose()


DOCKER_SKIP = docker_skip_reason("palaestra/base:bookworm")


@pytest.mark.slow
@pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
@pytest.mark.parametrize("image", ["/", "/root/.palaestra", "../../", "./x", "a/../../b"])
async def test_docker_refuses_an_image_that_is_a_path(image: str) -> None:
    from palaestra.sandbox.docker import DockerBackend

    backend = DockerBackend()
    try:
        with pytest.raises(SandboxSpecError, match="never a host path"):
            await backend.create(SandboxSpec(image=image))
        with pytest.raises(SandboxSpecError, match="host root"):
            await backend.create(SandboxSpec(ro_binds=(("/", "/host"),)))
        assert backend.live_count == 0
    finally:
        await backend.aclose()
