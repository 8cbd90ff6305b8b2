"""The `docker` backend (DESIGN §5): one container per sandbox on the local docker engine.

One concern a module: `backend` (creating sandboxes, reaping dead servers' leftovers),
`sandbox` (a container's lifecycle and execs), `engine` (the SDK, the socket, image names,
spec checks, owner labels), `scripts` (the sweep that kills what an exec left), `files` (the
archive API), `shell` (the persistent shell over ``docker exec -i``).
"""

from palaestra.sandbox.docker.backend import DockerBackend
from palaestra.sandbox.docker.engine import BASE_IMAGE, docker_available
from palaestra.sandbox.docker.sandbox import DockerSandbox

__all__ = ["BASE_IMAGE", "DockerBackend", "DockerSandbox", "docker_available"]
