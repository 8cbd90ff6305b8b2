"""Try the kernel calls that reach shared budgets; print what each returned, as JSON.

io_uring_setup; inotify_init1 (up to `inotify` instances, held for `hold` seconds);
mq_open. An errno name where a call failed."""

import ctypes
import errno
import json
import os
import platform
import sys
import time

args = json.loads(sys.stdin.read() or "{}")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "x86_64": {"io_uring_setup": 425, "inotify_init1": 294, "mq_open": 240},
    "aarch64": {"io_uring_setup": 425, "inotify_init1": 26, "mq_open": 180},
}[platform.machine()]


def call(name: str, *a: object) -> int | str:
    rc = libc.syscall(NR[name], *a)
    return rc if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


out = {}
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
out["io_uring_setup"] = call("io_uring_setup", ctypes.c_uint(4), params)
fds, first_error = [], None
for _ in range(args.get("inotify", 1)):
    rc = call("inotify_init1", 0)
    if not isinstance(rc, int):
        first_error = rc
        break
    fds.append(rc)
out["inotify_instances"] = len(fds)
out["inotify_error"] = first_error
name = ctypes.c_char_p(f"q{os.getpid()}".encode())  # the raw call takes no leading "/"
out["mq_open"] = call(
    "mq_open", name, ctypes.c_int(os.O_CREAT | os.O_RDWR), ctypes.c_int(0o600), ctypes.c_void_p(0)
)
print(json.dumps(out), flush=True)
time.sleep(args.get("hold", 0))
