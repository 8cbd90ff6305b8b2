"""The terminal verifier's in-sandbox runner (stdlib only; it runs as `python3 -I -c`).

`palaestra.verifiers.terminal` sends this file's source as the `-c` program of an exec in
the fresh verification sandbox; its stdin is a per-run random nonce (one line), a JSON
config (one line) and, for `test-sh`, a tar of the verifier files. Why a separate
process: the verdict must come from a process the agent's code never ran in, and that
code cannot reach.

- Before anything of the task runs, the runner takes the exec's stdout for itself (a
  descriptor no child inherits; children's stdout goes to stderr), reads its nonce from
  stdin (never in argv or the environment) and makes itself non-dumpable (no same-uid
  process can read or write its memory or descriptors through /proc).
- Every line it writes to that channel starts with the nonce; the verifier ignores any
  other line, and a run without its closing line scores 0.

Modes:
- `pytest`: restores the task's declared test files and configuration, then runs pytest on
  the requested node ids in one forked child per test file (repo_runner.py, sent in the
  config), where the agent's code runs in a worker process behind proxies: only this
  process, which never imports agent code, writes the channel.
- `test-sh`: unpacks the verifier files, writes `python3`/`python`/`bash`/`sh`/`pytest`
  wrappers (`write_wrappers`, from the config's `programs`: the files of this folder) into
  a folder where they can run (or reports INFRA: a step that cannot run voids, never skips),
  runs `bash $VERIFIER_DIR/test.sh` with a fresh HOME, an isolated environment and a PATH
  holding no workspace folder, kills whatever it left behind, then reports its exit status
  (and the reward file, only for a task that declares one) with the per-file counts of the
  CTRF / JUnit reports the run wrote into the fresh logs folder. Through the wrappers, the
  verifier's Python (pytest, its scripts, ``-c`` code) starts under import_guard.py (no
  workspace module stands in for the standard library or the test tooling), pytest under
  the monitor of pytest_boot.py (exit 0 only for a session that reached its end with every
  test passed; the agent's modules its tests import run in a jailed worker behind
  proxies, `WORKER_PROGRAMS`), and a program of the agent's under agent_jail.py
  (Landlock: it cannot open the verifier's files, logs, wrappers or HOME). Where the
  verifier image has uv (images/verifier/), `uv`/`uvx` wrappers (uv_boot.py) run it
  offline, a pytest it runs under the same guard and monitor.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from typing import Any

PR_SET_DUMPABLE = 4
HOST_PID_NS = 0xEFFFFFFC  # the initial pid namespace's inode (PROC_PID_INIT_INO)
EXEC_DIRS = ("/tmp", "/dev/shm", "/var/tmp")
# Where any program may write in the verification sandbox: what is found there (but the
# runner's own folders) may be the agent's code, copied or built (exec_guard.py).
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
DROP_PREFIXES = ("PYTHON", "PYTEST_", "LD_", "BASH_FUNC_", "GIT_", "UV_")
DROP_NAMES = ("BASH_ENV", "ENV", "CDPATH", "GLOBIGNORE", "PROMPT_COMMAND", "SHELLOPTS",
              "VIRTUAL_ENV", "CONDA_PREFIX")  # fmt: skip
# The verifier image's test-time tools (images/verifier/): uv, uvx and their wheels.
TOOLS_UV = "/opt/palaestra-verifier/bin/uv"
TOOLS_WHEELS = "/opt/palaestra-verifier/wheels"
# uv's installer, which standard test scripts run and then source; offline it cannot run.
UV_ENV_FILE = "# palaestra: uv is preinstalled in the verifier image; nothing to add\n"
# The worker of pytest_boot.py's proxies, beside the wrappers (hidden from the agent's code).
WORKER_PROGRAMS = (
    "repo_wire.py",
    "repo_strict.py",
    "repo_proxy.py",
    "repo_worker.py",
    "agent_jail.py",
)
MAX_RESULTS_FILE = 8 * 1024 * 1024
MAX_REPORTS = 20  # CTRF / JUnit files read a run
MAX_RESULT_NAMES = 200  # test files counted a run (the rest are summed under "…")
GIT_CONFIG = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("safe.directory", "*"),
)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


class Channel:
    """The runner's own stdout: nonce-prefixed JSON lines no child process can write."""

    def __init__(self, nonce: str) -> None:
        fd = os.dup(1)
        os.set_inheritable(fd, False)
        os.dup2(2, 1)  # anything else printed (tests, pytest, children) goes to stderr
        self._out = os.fdopen(fd, "w", buffering=1)
        self._nonce = nonce

    def emit(self, kind: str, data: object) -> None:
        self._out.write(f"{self._nonce} {kind} {json.dumps(data)}\n")
        self._out.flush()


def non_dumpable() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def clean_env(workdir: str, home: str, path: str) -> dict[str, str]:
    """The environment of every verifier process: no interpreter, loader, shell or git
    variable the task's environment set, a fresh HOME, the verifier's PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(DROP_PREFIXES) and k not in DROP_NAMES
    }
    env.update(
        HOME=home,
        PATH=path,
        XDG_CONFIG_HOME=os.path.join(home, ".config"),
        XDG_CACHE_HOME=os.path.join(home, ".cache"),
        XDG_DATA_HOME=os.path.join(home, ".local", "share"),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        GIT_CONFIG_GLOBAL=os.path.join(home, ".gitconfig"),
        GIT_CONFIG_COUNT=str(len(GIT_CONFIG)),
        GIT_PAGER="cat",
        WORKDIR=workdir,
    )
    for i, (key, value) in enumerate(GIT_CONFIG):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def safe_path(workdir: str, path: str) -> str:
    """PATH without a relative entry, the workdir or anything under it, or /tmp."""
    keep = []
    for entry in path.split(":"):
        norm = os.path.normpath(entry) if entry else ""
        if not os.path.isabs(norm):
            continue
        if any(norm == d or norm.startswith(d.rstrip("/") + "/") for d in (workdir, "/tmp")):
            continue
        if norm not in keep:
            keep.append(norm)
    return ":".join(keep) or "/usr/local/bin:/usr/bin:/bin"


def exec_dir() -> str | None:
    """A fresh folder whose files can be executed (a noexec /tmp is skipped), or None."""
    for base in EXEC_DIRS:
        try:
            d = tempfile.mkdtemp(prefix="palaestra-bin.", dir=base)
        except OSError:
            continue
        probe = os.path.join(d, "probe")
        try:
            with open(probe, "w") as f:
                f.write("#!/bin/sh\nexit 0\n")
            os.chmod(probe, 0o755)
            if subprocess.run([probe], stdin=subprocess.DEVNULL, timeout=10).returncode == 0:
                os.unlink(probe)
                return d
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(d, ignore_errors=True)
    return None


def kill_others() -> None:
    """Kill every other process this uid runs here but our own ancestors: nothing a test
    started may go on writing once the test's exit status is in. Only inside a pid
    namespace of its own (every sandbox backend gives one): run by hand on a host, it
    would kill every process of the user's, the engine's and the server's included."""
    try:
        if os.stat("/proc/self/ns/pid").st_ino == HOST_PID_NS:
            return
    except OSError:
        return
    keep = set()
    pid = os.getpid()
    while pid > 1:
        keep.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    uid = os.getuid()
    for _ in range(3):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in keep or int(name) == 1:
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


def read_reward(path: str) -> tuple[float | None, str]:
    """A reward in [0, 1] with at most two decimals from `path`, or (None, why)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "no reward file"
    if not stat.S_ISREG(st.st_mode):
        return None, "the reward file is not a regular file"
    with open(path, "rb") as f:
        raw = f.read(64).decode("ascii", "replace").strip()
    try:
        value = float(raw)
    except ValueError:
        return None, f"reward.txt holds {raw!r}, not a number in [0, 1]"
    if not 0.0 <= value <= 1.0 or round(value, 2) != value:
        return None, f"reward.txt holds {raw!r}, not a number in [0, 1] with two decimals"
    return value, ""


def read_reward_json(logs: str) -> tuple[float | None, str]:
    """Harbor's named rewards (``reward.json``: an object of numbers in [0, 1]) as one
    reward: the least of them (full credit only when every named reward is met)."""
    path = os.path.join(logs, "reward.json")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "no reward file"
    if not stat.S_ISREG(st.st_mode) or st.st_size > 65536:
        return None, "reward.json is not a regular file of at most 64 KiB"
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except ValueError:
        return None, "reward.json is not JSON"
    values = list(data.values()) if isinstance(data, dict) else []
    ok = [v for v in values if type(v) in (int, float) and 0.0 <= v <= 1.0]
    if not values or len(ok) != len(values):
        return None, "reward.json is not an object of numbers in [0, 1]"
    return round(float(min(ok)), 2), ""


def reward_of(logs: str) -> tuple[float | None, str]:
    """The task's reward from reward.txt and reward.json: the least of those present (a
    test script writes one; a second one, which code the tests imported could write,
    never raises it), or (None, why)."""
    found = [read_reward(os.path.join(logs, "reward.txt")), read_reward_json(logs)]
    present = [(value, why) for value, why in found if why != "no reward file"]
    bad = [why for value, why in present if value is None]
    if bad:
        return None, bad[0]
    if not present:
        return None, "no reward file"
    least = min(value for value, _ in present if value is not None)
    return least, "" if len(present) == 1 else "the least of reward.txt and reward.json"


def _count(files: dict[str, list[int]], name: str, ok: bool | None) -> None:
    """One test of file `name`: ok True passed, False failed, None neither (skipped)."""
    name = (name or "?")[:200]
    if name not in files and len(files) >= MAX_RESULT_NAMES:
        name = "…"
    entry = files.setdefault(name, [0, 0, 0])
    entry[2] += 1
    if ok is True:
        entry[0] += 1
    elif ok is False:
        entry[1] += 1


def ctrf_counts(data: object) -> dict[str, list[int]] | None:
    """A CTRF report's [passed, failed, total] per test file, or None if it is not one."""
    results = data.get("results") if isinstance(data, dict) else None
    tests = results.get("tests") if isinstance(results, dict) else None
    if not isinstance(tests, list):
        return None
    files: dict[str, list[int]] = {}
    for test in tests:
        if not isinstance(test, dict):
            continue
        status = test.get("status")
        name = str(test.get("filePath") or test.get("file_path") or test.get("suite") or "")
        _count(files, name, True if status == "passed" else None if status == "skipped" else False)
    return files


def junit_counts(root: object) -> dict[str, list[int]] | None:
    """A JUnit XML report's [passed, failed, total] per test file, or None."""
    tag = getattr(root, "tag", None)
    if tag not in ("testsuites", "testsuite"):
        return None
    files: dict[str, list[int]] = {}
    for case in root.iter("testcase"):  # type: ignore[attr-defined]
        name = case.get("file") or case.get("classname") or ""
        kinds = {child.tag for child in case}
        ok = False if kinds & {"failure", "error"} else None if "skipped" in kinds else True
        _count(files, name, ok)
    return files


def read_results(logs: str) -> dict[str, dict[str, object]]:
    """The CTRF JSON and JUnit XML reports this run's tests wrote into `logs` (a folder
    made fresh for this run): per report, its format and per-file counts."""
    found: dict[str, dict[str, object]] = {}
    for base, _dirs, names in os.walk(logs):
        for name in sorted(names):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, logs)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RESULTS_FILE:
                    continue
                if name.endswith(".json"):
                    with open(path, "rb") as f:
                        counts, kind = ctrf_counts(json.loads(f.read())), "ctrf"
                elif name.endswith(".xml"):
                    counts, kind = junit_counts(ET.parse(path).getroot()), "junit"
                else:
                    continue
            except (OSError, ValueError, ET.ParseError, RecursionError):
                continue
            if counts is not None and len(found) < MAX_REPORTS:
                found[rel] = {"format": kind, "files": counts}
    return found


def write_wrappers(bindir: str, real: str, path: str, boot: dict[str, str]) -> None:
    """python3/python, bash/sh, pytest (and uv/uvx where the image has uv) in `bindir`:
    the verifier's programs under import_guard.py and its boots, the agent's confined by
    agent_jail.py (see the module doc)."""
    with open(os.path.join(bindir, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    guard = boot["import_guard.py"]
    subst = {
        "@REAL@": _quote(real),
        "@PYTEST_BOOT@": _quote(guard + "\n" + boot["pytest_boot.py"]),
        "@SCRIPT_BOOT@": _quote(guard + "\n" + boot["script_boot.py"]),
        "@AGENT_JAIL@": _quote(boot["agent_jail.py"]),
    }
    python = boot["python_wrapper.sh"]
    for key, value in subst.items():
        python = python.replace(key, value)
    wrappers = [("python3", python), ("python", python)]
    for name in ("bash", "sh"):
        shell = shutil.which(name, path=path)
        if shell is not None:
            text = boot["shell_wrapper.sh"].replace("@SHELL@", _quote(shell))
            for key, value in subst.items():
                text = text.replace(key, value)
            wrappers.append((name, text))
    for name in ("pytest", "py.test"):
        wrappers.append((name, f'#!/bin/sh\nexec {_quote(bindir)}/python3 -m pytest "$@"\n'))
    if os.access(TOOLS_UV, os.X_OK):
        uv_boot = f"exec {_quote(real)} -I -c {_quote(boot['uv_boot.py'])}"
        pytest_boot = subst["@PYTEST_BOOT@"]
        wrappers += [(n, f'#!/bin/sh\n{uv_boot} {n} {pytest_boot} "$@"\n') for n in ("uv", "uvx")]
    for name, text in wrappers:
        with open(os.path.join(bindir, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(bindir, name), 0o755)
    # what pytest_boot.py starts for the agent's code the tests import (repo_worker.py)
    os.makedirs(os.path.join(bindir, "worker"), exist_ok=True)
    for name in WORKER_PROGRAMS:
        with open(os.path.join(bindir, "worker", name), "w") as f:
            f.write(boot[name])


def exec_guard(
    boot: dict[str, str], real: str | None, hidden: list[str], workdir: str, agent_tmp: str
) -> Any:
    """exec_guard.py's tracer for test.sh (every program of the agent's the checker starts
    runs confined), or why it cannot run here."""
    space: dict[str, Any] = {"__name__": "palaestra_exec_guard"}
    exec(compile(boot["exec_guard.py"], "exec_guard.py", "exec"), space)
    why = space["available"]() or ("" if real else "no python3 for the jail")
    if why:
        return why
    bindir = hidden[2]
    jail = space["jail_argv"](real, boot["agent_jail.py"], hidden, bindir, agent_tmp)
    own = [*hidden, os.path.dirname(os.path.dirname(TOOLS_UV))]
    policy = space["Policy"](own, [workdir, agent_tmp, *SCRATCH], jail)
    return space["Tracer"](policy)


def run_test_sh(chan: Channel, cfg: dict[str, object]) -> None:
    workdir, vdir, logs = str(cfg["workdir"]), str(cfg["verifier_dir"]), str(cfg["logs"])
    try:
        for d in (vdir, logs):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
        # the verifier's files, then (a second archive) the task's test-time installs
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|", ignore_zeros=True) as tf:
            tf.extractall(vdir)
    except (OSError, tarfile.TarError) as exc:
        chan.emit("INFRA", f"the verifier files could not be unpacked: {exc}")
        return
    bindir = exec_dir()
    if bindir is None:
        chan.emit("INFRA", f"no folder of {', '.join(EXEC_DIRS)} lets the verifier run files")
        return
    home = tempfile.mkdtemp(prefix="palaestra-home.", dir="/tmp")
    agent_tmp = tempfile.mkdtemp(prefix="palaestra-agent-tmp.", dir="/tmp")
    path = safe_path(workdir, os.environ.get("PATH", ""))
    real = shutil.which("python3", path=path)
    if real is not None:
        write_wrappers(bindir, real, path, cfg["programs"])  # type: ignore[arg-type]
    os.makedirs(os.path.join(home, ".local", "bin"))
    with open(os.path.join(home, ".local", "bin", "env"), "w") as f:
        f.write(UV_ENV_FILE)
    env = clean_env(workdir, home, f"{bindir}:{path}")
    env.update(PALAESTRA_UV=TOOLS_UV, PALAESTRA_UV_WHEELS=TOOLS_WHEELS, PALAESTRA_BIN=bindir)
    env["PALAESTRA_PYTHON"] = real or ""
    env.update(VERIFIER_DIR=vdir, VERIFIER_LOGS=logs)
    env["PALAESTRA_PYTEST_INI"] = os.path.join(bindir, "pytest.ini")
    env["PALAESTRA_CALL_TIMEOUT"] = str(cfg.get("call_timeout_s") or 600)
    # What agent_jail.py keeps every program of the agent's from opening.
    env.update(PALAESTRA_HIDDEN=":".join((vdir, logs, bindir, home)), PALAESTRA_AGENT_TMP=agent_tmp)
    if not os.path.isdir(workdir):
        chan.emit("RESULT", {"rc": None, "note": f"the workdir {workdir} is gone"})
        return
    bash = shutil.which("bash", path=path) or "/bin/bash"
    argv = [bash, os.path.join(vdir, "test.sh")]
    hidden = [vdir, logs, bindir, home]
    site = str(cfg.get("site") or "")  # the test-time installs the server put there, if any
    outside = not os.path.realpath(site).startswith(workdir.rstrip("/") + "/")
    if site and outside and os.path.isdir(site):
        env["PALAESTRA_SITE"] = site
        env["PALAESTRA_HIDDEN"] += ":" + site
        hidden.append(site)
    guard = exec_guard(cfg["programs"], real, hidden, workdir, agent_tmp)  # type: ignore[arg-type]
    if isinstance(guard, str):
        sys.stderr.write(f"palaestra: {guard}; only the wrappers confine the agent's programs\n")
        rc = subprocess.run(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL).returncode
    else:
        rc = guard.run(argv, workdir, env)
        guard = guard.refused or guard
    kill_others()
    result: dict[str, object] = {"rc": rc, "results": read_results(logs)}
    if isinstance(guard, str):
        result["guard"] = guard
    if cfg.get("reward_file"):
        result["reward"], result["reward_note"] = reward_of(logs)
    chan.emit("RESULT", result)


def run_pytest(chan: Channel, cfg: dict[str, object]) -> None:
    """Mode `pytest`: the config's `program` (repo_runner.py of this folder) runs the sets
    in a parent that never imports agent code and one child per test file."""
    workdir = str(cfg["workdir"])
    home = tempfile.mkdtemp(prefix="palaestra-home.", dir="/tmp")
    env = clean_env(workdir, home, safe_path(workdir, os.environ.get("PATH", "")))
    space: dict[str, object] = {"__name__": "palaestra_repo_runner"}
    exec(compile(str(cfg["program"]), "repo_runner.py", "exec"), space)
    space["run"](chan.emit, cfg, env, home, kill_others)  # type: ignore[operator]


def main() -> None:
    nonce = sys.stdin.buffer.readline().decode().strip()
    cfg = json.loads(sys.stdin.buffer.readline())
    non_dumpable()
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    chan = Channel(nonce)
    chan.emit("READY", mode)
    if mode == "pytest":
        run_pytest(chan, cfg)
    elif mode == "test-sh":
        run_test_sh(chan, cfg)
    else:
        chan.emit("INFRA", f"unknown mode {mode!r}")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
