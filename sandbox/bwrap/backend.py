"""`BwrapBackend`: creates `BwrapSandbox`es, and holds what they share on one host (the
cgroup manager, the seccomp status, the exec helper, the budget of jails started ahead)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

from palaestra.sandbox import exechelper
from palaestra.sandbox.base import (
    BASE_PATH,
    Backend,
    SandboxCreateError,
    SandboxSpec,
    SandboxSpecError,
    SocketService,
    check_gateway,
    close_all,
    default_cache,
)
from palaestra.sandbox.bwrap.host import (
    bwrap_available,
    default_runtime_base,
    is_root,
    log_once,
    raise_nofile,
    reap_stale,
)
from palaestra.sandbox.bwrap.jail import JailBudget
from palaestra.sandbox.bwrap.launch import CgroupMode, LimitMode, resolve_cgroups, seccomp_status
from palaestra.sandbox.bwrap.sandbox import BwrapSandbox
from palaestra.sandbox.bwrap.spec import check_spec
from palaestra.sandbox.cgroups import CgroupManager
from palaestra.sandbox.egress import EgressProxy, check_network
from palaestra.sandbox.preamble import SANDBOX_UID


class BwrapBackend(Backend):
    """Creates `BwrapSandbox`es, by default under /run/palaestra/sandboxes/<pid>/ as root.

    `cache` is the operator's cache folder (the exec helper is built under it); `images_dir`
    holds the image rootfs folders a spec's `image` names (default ``<cache>/images``);
    `egress` is the server's proxy, the only way out of a sandbox whose spec has `network`;
    `gateway` serves the one listener of a sandbox whose spec has `gateway` (harness mode)."""

    name = "bwrap"

    def __init__(
        self,
        runtime_dir: Path | None = None,
        *,
        cache: Path | None = None,
        images_dir: Path | None = None,
        host_uid: int = SANDBOX_UID,
        limits: LimitMode = "auto",
        cgroups: CgroupMode | CgroupManager = "auto",
        seccomp_filter: bool = True,
        exec_helper: bool = True,
        prespawn: bool = True,
        max_ready_jails: int = 256,
        egress: EgressProxy | None = None,
        gateway: SocketService | None = None,
    ) -> None:
        self.cache = cache if cache is not None else default_cache()
        self.images_dir = images_dir if images_dir is not None else self.cache / "images"
        self.cgroups, self.cgroup_status = resolve_cgroups(cgroups)
        if runtime_dir is None:
            # One folder per server process, so a server can reap what a dead one left behind.
            base = default_runtime_base()
            reap_stale(base, cgroups=self.cgroups is not None or is_root())
            runtime_dir = base / str(os.getpid())
        log_once(logging.INFO if self.cgroups else logging.WARNING, f"bwrap: {self.cgroup_status}")
        self.seccomp, self.seccomp_status = seccomp_status(seccomp_filter)
        if seccomp_filter and not self.seccomp:
            log_once(logging.WARNING, f"bwrap: {self.seccomp_status}")
        self.runtime_dir = runtime_dir
        self.host_uid = host_uid
        self.limits: LimitMode = limits
        self._bwrap: str | None = None  # bwrap's path once the probe passed
        self.prespawn = prespawn and max_ready_jails > 0
        self.jails = JailBudget(max_ready_jails)
        if self.prespawn:
            raise_nofile()
        self._want_helper = exec_helper
        self._helper: Path | None = None
        self.helper_status = "exec helper not resolved yet" if exec_helper else "exec helper off"
        self._live: set[BwrapSandbox] = set()
        self.egress = egress  # what a sandbox with spec.network reaches (and nothing else)
        self.gateway = gateway  # what a sandbox with spec.gateway reaches (and nothing else)

    def _resolve_helper(self) -> Path | None:
        """Build (once per machine) and install (once per backend) the exec helper."""
        if self._helper is None and self._want_helper:
            self._want_helper = False  # resolved once, whatever the outcome
            path, why = exechelper.helper_binary(self.cache)
            if path is not None:
                try:
                    self._helper = exechelper.install(self.runtime_dir, self.cache)
                except OSError as e:
                    why = f"cannot install the exec helper in {self.runtime_dir}: {e}"
            if self._helper is not None:
                self.helper_status = f"exec helper {self._helper}"
            else:
                self.helper_status = f"exec helper unavailable (sh + setpriv launcher): {why}"
                log_once(logging.WARNING, f"bwrap: {self.helper_status}")
        return self._helper

    @staticmethod
    def available() -> tuple[bool, str]:
        return bwrap_available()

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def create(self, spec: SandboxSpec) -> BwrapSandbox:
        check_spec(spec, self.images_dir)
        check_network(spec, self.egress, self.name)
        check_gateway(spec, self.gateway, self.name)
        own_netns = spec.network or spec.gateway is not None
        if own_netns and shutil.which("nsenter", path=BASE_PATH) is None:
            raise SandboxSpecError(
                "network or gateway: bwrap jails enter the sandbox's network namespace with"
                f" nsenter (util-linux), which is not in {BASE_PATH}"
            )
        if self._bwrap is None:  # probed once per backend (off the event loop), then known
            ok, why = await asyncio.to_thread(bwrap_available)
            if not ok:
                raise SandboxCreateError(why)
            self._bwrap = why
        why = self._bwrap
        helper = self._helper
        if helper is None and self._want_helper:
            helper = await asyncio.to_thread(self._resolve_helper)
        box = BwrapSandbox(
            spec,
            images_dir=self.images_dir,
            bwrap=why,
            runtime_dir=self.runtime_dir,
            host_uid=self.host_uid,
            limits=self.limits,
            on_close=self._live.discard,
            cgroups=self.cgroups,
            seccomp_filter=self.seccomp,
            helper=helper,
            prespawn=self.prespawn,
            jails=self.jails,
            egress=self.egress,
            gateway=self.gateway,
        )
        try:
            await box.setup()
        except BaseException:
            await asyncio.shield(box.close())
            raise
        self._live.add(box)
        return box

    async def aclose(self) -> None:
        await close_all(self._live)
        if self.cgroups is not None:
            self.cgroups.release()  # palaestra/<pid>/ itself, once its sandboxes are gone
