"""The `bwrap` backend (DESIGN §5): Linux namespaces via bubblewrap, no daemon.

Every exec is one bwrap jail with every namespace unshared (network: loopback only; with
`SandboxSpec.network` or `SandboxSpec.gateway` one namespace per sandbox holding only the
egress proxy's or the model gateway's socket), a
read-only root (the host's ``/usr`` or an image's rootfs), a fresh ``/proc``, ``/dev`` and
``/tmp``, the workspace at the workdir, a cleared environment, uid 1000 with no capabilities,
a seccomp filter, the sandbox's cgroup and rlimits.  Nothing else of the host is mounted.

One concern a module: `backend` (what sandboxes of one host share), `sandbox` (a sandbox's
lifecycle and execs), `spec` (what a spec may ask for, image names), `mounts` (its
filesystem and the bwrap argv), `launch` (cgroup join, rlimits, host uid, seccomp before
bwrap starts), `jail` (one bwrap per exec, the one started ahead), `run` (an exec in a jail
to its end), `files` (the workspace from the host), `shell` (the persistent shell), `host`
(bwrap, RAM, CPUs, runtime folders of dead servers).  docs/reference/sandboxes.md says why.
"""

from palaestra.sandbox.bwrap.backend import BwrapBackend
from palaestra.sandbox.bwrap.host import bwrap_available
from palaestra.sandbox.bwrap.sandbox import BwrapSandbox

__all__ = ["BwrapBackend", "BwrapSandbox", "bwrap_available"]
