"""What the server serves, for the routes that read or change it: families, packs, tasks,
the sampler's report and the pack registry (publish, enable, download). Episodes are the
front's (server/manager.py); this holds no episode state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from palaestra.sandbox import Sandbox, SandboxSpec
from palaestra.sandbox.base import spool_file
from palaestra.sdk.client import TaskQuery
from palaestra.sdk.errors import BadRequestError, PermissionDeniedError, UnavailableError
from palaestra.sdk.models import (
    FamilyInfo,
    PackInfo,
    PackYankResponse,
    SamplerReleaseResponse,
    SamplerReport,
    TaskList,
)
from palaestra.server.auth import ADMIN, ADMIN_PRINCIPAL, EVAL, PUBLISH, Principal
from palaestra.server.config import Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.archive import write_pack_archive
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.drawing import Draws
from palaestra.server.packs.generate import GenerateLimits, generate_pack
from palaestra.server.packs.loader import GeneratedSet, Pack
from palaestra.server.packs.manifest import PackManifest, semver_key
from palaestra.server.packs.registry import ADMIN_RIGHTS, PackRegistry, PublishRights
from palaestra.server.packs.taskfields import HostPolicy
from palaestra.server.sampler import Sampler
from palaestra.server.sandboxes import SandboxOwner
from palaestra.server.store import Store

MAX_LISTED = 5  # over-limit cheats named in a refused publish's message


class Catalog:
    def __init__(
        self,
        settings: Settings,
        *,
        families: FamilyRegistry,
        packs: PackCatalog,
        sampler: Sampler,
        store: Store,
        registry: PackRegistry | None,
        sandboxes: SandboxOwner | None = None,
        after_publish: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.families = families
        self.packs = packs
        self.sampler = sampler
        self.store = store
        self.registry = registry
        self.sandboxes = sandboxes  # where a publish token's generators run
        self.after_publish = after_publish  # a cluster front exports the pack for its workers

    # -- discovery ------------------------------------------------------------------------
    def family_infos(self) -> list[FamilyInfo]:
        domains: dict[str, set[str]] = {}
        for pack in self.packs.all():
            for task in pack.tasks.values():
                domains.setdefault(task.family, set()).add(task.domain)
        return [
            FamilyInfo(
                name=f.name,
                description=f.description,
                tools=f.tool_specs(),
                domains=sorted(domains.get(f.name, ())),
            )
            for f in self.families.all()
        ] + [
            FamilyInfo(name=b.name, description="", tools=[], error=b.message())
            for b in self.families.broken()
        ]

    def pack_infos(self) -> list[PackInfo]:
        return [self._with_versions(p) for p in self.packs.all()]

    def pack_info(self, name: str) -> PackInfo:
        """The latest version (or `name@version`), listing every version served."""
        return self._with_versions(self.packs.get(name))

    def _with_versions(self, pack: Pack) -> PackInfo:
        versions = sorted(
            (p.version for p in self.packs.all() if p.name == pack.name), key=semver_key
        )
        yanked = (
            f"{pack.name}@{pack.version} is yanked: its publisher withdrew it; served only "
            "to exact pins (pin another version)"
            if self.packs.is_yanked(pack.name, pack.version)
            else None
        )
        return pack.info().model_copy(update={"versions": versions, "yanked": yanked})

    # -- the pack registry (publish, download) ----------------------------------------------
    async def publish(
        self, data: bytes | BinaryIO, principal: Principal = ADMIN_PRINCIPAL
    ) -> tuple[Pack, bool]:
        """Verify and install a pack archive, bytes or a file at its start (DESIGN §6);
        (pack, whether it is new)."""
        principal.require(PUBLISH, "publishing a pack")
        if self.registry is None:
            raise UnavailableError("this server has no pack registry", code="no_registry")
        s = self.settings
        rights = (
            ADMIN_RIGHTS
            if principal.is_admin
            else PublishRights.publisher(
                principal.orgs,
                builtin_orgs=s.builtin_orgs,
                max_bytes=s.publisher_max_bytes,
                max_versions=s.publisher_max_versions,
            )
        )
        pack, created = await self.registry.ainstall(  # its own bounded threads
            data,
            generate=None if principal.is_admin else self._generate,
            publisher=principal.name,
            families=self.families.all(),
            catalog=self.packs,
            allow_code=principal.is_admin,
            rights=rights,
            policy=HostPolicy.from_settings(s),
            broken=self.families.unavailable(),
            audit=self._audit,
        )
        if created:
            self.sampler.refresh()
            if self.after_publish is not None:
                await self.after_publish()
        return pack, created

    def _audit(self, pack: Pack) -> None:
        """Play the family's cheats and the generic cheat library on a sample of the pack's
        tasks (`publish_check_tasks`, on an install thread); refuse the pack (400
        `cheat_over_limit`) where any scores above its `cheat_max_reward`."""
        if self.settings.publish_check_tasks <= 0:
            return
        from palaestra.server.packcheck import audit_pack  # the check builds a manager

        report = audit_pack(pack, self.families, self.settings, self.settings.publish_check_tasks)
        if not report.over_limit:
            return
        worst = sorted(report.over_limit, key=lambda o: (-o.reward, o.cheat, o.task))
        listed = "; ".join(
            f"{o.cheat!r} scored {o.reward:.3f} on task {o.task}" for o in worst[:MAX_LISTED]
        )
        more = f" (and {len(worst) - MAX_LISTED} more)" if len(worst) > MAX_LISTED else ""
        raise BadRequestError(
            f"pack {pack.name}@{pack.version} refused: {len(worst)} cheat(s) scored more than "
            f"its cheat_max_reward {report.cheat_max:g}: {listed}{more}; run `palaestra pack "
            "check` on it, harden the verifier, or list a cheat it cannot stop under "
            "[checks.allow_cheats]",
            code="cheat_over_limit",
        )

    async def _generate(
        self,
        root: Path,
        manifest: PackManifest,
        draws: Draws | None = None,
        only: set[str] | None = None,
    ) -> GeneratedSet:
        """A publish token's generator pack, generated in sandboxes (sealed seeds from the
        server's secret, passed in as numbers; at the served held-out draws, or `draws`;
        `only` these splits: a rotation, server/draws.py)."""
        if self.sandboxes is None:
            raise UnavailableError("this server has no sandboxes", code="no_generator_sandbox")
        owner = self.sandboxes
        where = f"pack {manifest.name}@{manifest.version} generators"

        async def create(spec: SandboxSpec) -> Sandbox:
            return await owner.create_cold(spec, where)

        limits = GenerateLimits.from_settings(self.settings)
        draws = self.packs.draws if draws is None else draws
        return await generate_pack(create, root, manifest, limits, self.packs.secret, draws, only)

    generate_draw = _generate  # a rotation's sandboxed generation (server/draws.py)

    async def enable_pack(self, name: str, principal: Principal = ADMIN_PRINCIPAL) -> bool:
        """Let unfiltered sampling draw a published pack (admin); False if it already could."""
        principal.require(ADMIN, "enabling a pack for unfiltered sampling")
        if self.registry is None:
            raise UnavailableError("this server has no pack registry", code="no_registry")
        changed = await asyncio.to_thread(self.registry.enable, name, principal.name, self.packs)
        self.sampler.refresh()
        return changed

    async def yank_pack(
        self, ref: str, principal: Principal = ADMIN_PRINCIPAL, *, undo: bool = False
    ) -> PackYankResponse:
        """Yank `name@version` (its publisher or an admin): `name` and sampling skip it,
        exact pins keep it; `undo` restores it."""
        principal.require(PUBLISH, "yanking a pack version")
        if self.registry is None:
            raise UnavailableError("this server has no pack registry", code="no_registry")
        name, _, version = ref.partition("@")
        if not version:
            raise BadRequestError(f"name the version to yank: {name}@<version>")
        changed = await asyncio.to_thread(
            self.registry.yank,
            name,
            version,
            principal.name,
            admin=principal.is_admin,
            undo=undo,
            catalog=self.packs,
        )
        self.sampler.refresh()
        return PackYankResponse(name=name, version=version, yanked=not undo, changed=changed)

    async def pack_archive(
        self, name: str, principal: Principal = ADMIN_PRINCIPAL
    ) -> tuple[Pack, BinaryIO]:
        """The archive of `name[@version]`, in an anonymous file of the spool folder at its
        start (the caller closes it: a pack may be gigabytes, never held in memory); refused
        (403) to non-admins when a split is sealed.

        A sealed split's private fields, verifier files and solutions never leave the server,
        and an archive holds them: only an admin (the server's operator) may take one."""
        pack = self.packs.get(name)
        sealed = sorted(s for s, is_sealed in pack.sealed.items() if is_sealed)
        if sealed and not principal.is_admin:
            raise PermissionDeniedError(
                f"pack {pack.name}@{pack.version} has sealed splits ({', '.join(sealed)}); "
                "its archive would carry their private data, so only an admin token may "
                "download it",
                code="sealed_pack",
            )

        def write() -> BinaryIO:
            out = spool_file(self.settings.spool_folder)
            try:
                write_pack_archive(pack.root, out)
                out.seek(0)
            except BaseException:
                out.close()
                raise
            return out

        return pack, await asyncio.to_thread(write)

    def task_list(self, query: TaskQuery) -> TaskList:
        q = query
        tasks = self.packs.select(pack=q.pack, split=q.split, family=q.family, domain=q.domain)
        page = tasks[q.offset : q.offset + q.limit]
        return TaskList(tasks=[t.info() for t in page], total=len(tasks))

    def sampler_report(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
        principal: Principal = ADMIN_PRINCIPAL,
    ) -> SamplerReport:
        """Per-task results of sealed splits only for `eval` and admin tokens."""
        return self.sampler.report(
            pack=pack, split=split, domain=domain, limit=limit, sealed=principal.has(EVAL)
        )

    def sampler_release(self, task: str) -> SamplerReleaseResponse:
        """Release a quarantined task (by its full ref, or any ref the registry resolves)."""
        ref = task
        if self.sampler.quarantine_note(ref) is None:
            ref = self.packs.resolve(task).ref  # 404 for an unknown task
        released = self.sampler.release(ref)
        if released:
            self.store.add_sampler_release(ref, time.time())
        return SamplerReleaseResponse(task=ref, released=released)
