"""The `terminal` family: multi-step work in a shell, verified by hidden tests.

An episode is a sandbox whose workdir (``/work`` unless the task says otherwise) holds the
task's `environment/` files (its `setup.sh` ran at reset and was removed). The agent works
through six tools: `bash` (one persistent shell per episode: cwd and variables survive
between calls), `read_file`, `write_file`, `edit_file` (exact string replace), `list_dir`
and `submit`. The file tools run as separate execs with paths relative to the workdir (or
absolute), so a broken shell never breaks them.

Every step is bounded: a command's wall time (`timeout`, at most `max_step_s`), its
output (head and tail kept, the middle cut, marked), and the episode's total output; the
manager bounds steps and wall time. A command that hangs, floods or kills the shell
returns with a mark and the episode goes on (a dead shell is restarted on the next
command, and the observation says so); only a dead *sandbox* voids the episode.

Verification (`palaestra.verifiers.terminal`) happens after the agent's sandbox is
closed -- every process the agent started is dead -- on a copy of its workdir in a fresh
sandbox, with the tests staged only then. docs/terminal.md is the task authors' contract.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from typing import Any

from pydantic import Field

from palaestra.envs import (
    BASE_PATH,
    Action,
    Assessment,
    EpisodeContext,
    ExecResult,
    Family,
    InvalidActionError,
    Limits,
    Observation,
    Sandbox,
    SandboxError,
    SandboxSpec,
    SandboxSpecError,
    ShellSession,
    State,
    StepOutcome,
    Task,
    Tool,
    ToolArgs,
    VerifierInfo,
    tool,
    workspace_abspath,
)
from palaestra.envs.terminal import cheats, envimage, testinstall
from palaestra.envs.terminal.fields import SETUP_TIMEOUT_S, TerminalPrivate, TerminalPublic
from palaestra.verifiers import terminal as verifier

DEFAULT_IMAGE = "terminal"  # docker: palaestra/terminal:latest; bwrap: the host's /usr
DEFAULT_STEP_TIMEOUT_S = 30.0
MAX_STEP_S = 600.0
DEFAULT_STEP_OUTPUT = 16 * 1024
MAX_STEP_OUTPUT = 1024 * 1024
DEFAULT_EPISODE_OUTPUT = 2 * 1024 * 1024
SETUP_SCRIPT = "setup.sh"
MAX_EDIT_BYTES = 1024 * 1024
MAX_LIST = 1000
PROBE_TIMEOUT_S = 10.0


class BashArgs(ToolArgs):
    command: str = Field(min_length=1, max_length=200_000, description="a bash command line")
    timeout: float | None = Field(
        default=None,
        gt=0,
        le=MAX_STEP_S,
        description="seconds before the command (and all it started) is killed; default 30",
    )


class ReadFileArgs(ToolArgs):
    path: str = Field(min_length=1, max_length=4096, description="relative to the workdir")
    offset: int = Field(default=0, ge=0, description="byte to start at")
    length: int | None = Field(default=None, gt=0, description="bytes to read (default: limit)")


class WriteFileArgs(ToolArgs):
    path: str = Field(min_length=1, max_length=4096, description="relative to the workdir")
    content: str = Field(max_length=MAX_EDIT_BYTES)


class EditFileArgs(ToolArgs):
    path: str = Field(min_length=1, max_length=4096, description="relative to the workdir")
    old: str = Field(min_length=1, max_length=MAX_EDIT_BYTES, description="exact text to find")
    new: str = Field(max_length=MAX_EDIT_BYTES, description="its replacement")
    replace_all: bool = Field(default=False, description="replace every match, not just one")


class ListDirArgs(ToolArgs):
    path: str = Field(default=".", max_length=4096, description="relative to the workdir")
    depth: int = Field(default=1, ge=1, le=5, description="levels to descend")


def _opt_float(options: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    raw = options.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise InvalidActionError(f"options.{key} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidActionError(f"options.{key} must be in [{low:g}, {high:g}], got {value:g}")
    return value


def step_limits(options: dict[str, Any]) -> dict[str, float]:
    """The family's per-step and per-episode limits, with the client's `options` applied."""
    return {
        "step_timeout_s": _opt_float(
            options, "step_timeout_s", DEFAULT_STEP_TIMEOUT_S, 0.1, MAX_STEP_S
        ),
        "max_step_s": MAX_STEP_S,
        "max_output_bytes": _opt_float(
            options, "max_output_bytes", DEFAULT_STEP_OUTPUT, 256, MAX_STEP_OUTPUT
        ),
        "max_episode_output_bytes": _opt_float(
            options, "max_episode_output_bytes", DEFAULT_EPISODE_OUTPUT, 1024, 1 << 30
        ),
    }


async def _copy_snapshot(box: Sandbox, workdir: str, task_id: str) -> None:
    """What the environment image's build put in the workdir (kept outside it by
    envimage's snapshot step), copied into the fresh workspace as the sandbox user."""
    snap = shlex.quote(envimage.SNAPSHOT_DIR)
    result = await box.exec(
        ["/bin/sh", "-c", f"test -d {snap} || exit 3; cp -a {snap}/. ./"],
        cwd=workdir,
        timeout=SETUP_TIMEOUT_S,
    )
    if not result.ok:
        raise SandboxError(
            f"task {task_id}: its environment image has no workdir snapshot at "
            f"{envimage.SNAPSHOT_DIR} or it cannot be copied (exit {result.exit_code}): "
            f"{(result.stdout + result.stderr)[-1500:]}; rebuild it with "
            "`palaestra images build --pack PACK`"
        )


def _format_bytes(n: int) -> str:
    return f"{n} bytes" if n < 10_240 else f"{n / 1024:.0f} KiB"


class TerminalState(State):
    shell: ShellSession | None = None  # started by the first `bash`
    output_bytes: int = 0  # the episode's tool output so far (its budget: `limits`)
    started: float = 0.0  # time.monotonic() at reset
    limits: dict[str, float] = Field(default_factory=lambda: step_limits({}))


Ctx = EpisodeContext[TerminalState]


class TerminalFamily(Family[TerminalState]):
    name = "terminal"
    description = (
        "Multi-step work in a persistent shell (files, text, git, builds, repositories); "
        "hidden tests judge the final workdir."
    )
    version = "0.1.0"

    public_fields = TerminalPublic
    private_fields = TerminalPrivate
    image = DEFAULT_IMAGE  # where a task names none (docker: its image; bwrap: host /usr)

    # -- task fields ---------------------------------------------------------------------
    @staticmethod
    def workdir(task: Task) -> str:
        return TerminalPublic.of(task).workdir

    def sandbox_spec(self, task: Task) -> SandboxSpec | None:
        """The task's sandbox: in its environment image where it has a build context."""
        public = TerminalPublic.of(task)
        build = TerminalPrivate.of(task).build
        return SandboxSpec(
            image=envimage.image_name(build, task.blob_refs("build")) if build else public.image,
            workdir=public.workdir,
            workspace_mb=public.workspace_mb,
            memory_mb=public.memory_mb,
            cpus=public.cpus,
            pids=public.pids,
            env=tuple(sorted(public.env.items())),
            network=public.allow_internet,
            egress_hosts=tuple(public.allowed_hosts),
            default_timeout_s=DEFAULT_STEP_TIMEOUT_S,
        )

    def fork_state(self, state: TerminalState) -> TerminalState:
        """A fork starts without a shell (a live process of the parent's sandbox): its first
        `bash` starts one in its own copy of the workdir, at the start's cwd."""
        return state.model_copy(update={"shell": None, "limits": dict(state.limits)})

    def checkpoint_state(self, state: TerminalState) -> Any:
        """Without the shell (a live process): the resumed episode's first `bash` starts
        one in the restored workdir, at the start's cwd."""
        return state.model_dump(mode="json", exclude={"shell"})

    def episode_limits(self, task: Task, options: dict[str, Any], limits: Limits) -> Limits:
        """The manager's limits with this family's per-step output cap (reset's `limits`);
        the task's `agent_timeout_s` is the wall time unless the client asked for one."""
        mine = step_limits(options)
        agent_s = TerminalPublic.of(task).agent_timeout_s
        wall = {"max_wall_s": agent_s} if agent_s and "max_wall_s" not in options else {}
        return limits.model_copy(
            update={
                **wall,
                "max_output_bytes": int(mine["max_output_bytes"]),
                "max_step_s": mine["max_step_s"],
                "max_episode_output_bytes": int(mine["max_episode_output_bytes"]),
            }
        )

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="terminal-tests", version=verifier.VERSION)

    # -- episode -------------------------------------------------------------------------
    async def reset(self, ctx: Ctx) -> Observation:
        limits = step_limits(ctx.options)
        task = ctx.task
        public = TerminalPublic.of(task)
        workdir = public.workdir
        box = ctx.sandboxes.episode
        assert box is not None
        env_files, env_blobs = public.environment, task.blobs_of("environment")
        if TerminalPrivate.of(task).build:
            await _copy_snapshot(box, workdir, task.id)
        if env_files or env_blobs:  # through a file on disk: blobs may be large
            with ctx.sandboxes.spool() as tar:
                await asyncio.to_thread(verifier.write_files_tar, tar, env_files, False, env_blobs)
                await box.upload_tar_from(tar)
        if SETUP_SCRIPT in env_files:
            result = await box.exec(
                [
                    "/bin/bash",
                    "-c",
                    f"bash ./{SETUP_SCRIPT} </dev/null; rc=$?; rm -f ./{SETUP_SCRIPT}; exit $rc",
                ],
                cwd=workdir,
                timeout=public.setup_timeout_s,
            )
            if not result.ok:
                raise SandboxError(
                    f"task {task.id}: environment/{SETUP_SCRIPT} failed "
                    f"(exit {result.exit_code}{', timed out' if result.timed_out else ''}): "
                    f"{(result.stdout + result.stderr)[-1500:]}"
                )
        ctx.state.started, ctx.state.limits = time.monotonic(), limits
        instruction = public.instruction.strip()
        hosts = f" ({', '.join(public.allowed_hosts)})" if public.allowed_hosts else ""
        network = (
            f"Only the hosts the operator allows{hosts or ' (package registries)'} are "
            "reachable, through the proxy in $HTTPS_PROXY."
            if public.allow_internet
            else "There is no network."
        )
        text = (
            f"{instruction}\n\n---\nYou are in a Linux sandbox; your working directory is "
            f"{workdir}. Tools: bash (a persistent shell; each command is killed after its "
            f"timeout, default {limits['step_timeout_s']:g} s, at most {MAX_STEP_S:g} s), "
            f"read_file, write_file, edit_file, list_dir. {network} Call submit "
            "when you are done: hidden tests then check the final state of the working "
            "directory."
        )
        data = {"workdir": workdir, "limits": limits, "tools": [t.name for t in self.tools]}
        return Observation(text=text, data=data)

    async def step(self, ctx: Ctx, tool: Tool, args: ToolArgs) -> StepOutcome:
        """The tool's own step, its output counted against the episode's output budget."""
        if ctx.sandboxes.episode is None:
            raise SandboxError("the episode's sandbox is gone")
        outcome = await super().step(ctx, tool, args)
        ctx.state.output_bytes += outcome.output_bytes or 0
        budget = int(ctx.state.limits["max_episode_output_bytes"])
        if ctx.state.output_bytes > budget and not outcome.done:
            outcome.observation.text += (
                f"\n[episode output limit of {_format_bytes(budget)} reached: the episode ends "
                "and the tests judge the working directory as it is]"
            )
            outcome.done = True
            outcome.info["stop_reason"] = "episode_output_limit"
        return outcome

    # -- tools ---------------------------------------------------------------------------
    @staticmethod
    def _box(ctx: Ctx) -> Sandbox:
        box = ctx.sandboxes.episode
        assert box is not None  # step checked
        return box

    @tool(
        "Run a command in this episode's persistent bash shell (cwd and variables persist; "
        "no terminal, stdin is /dev/null). Returns its output (stdout and stderr merged), exit "
        "code and the shell's cwd. Long output keeps its head and tail."
    )
    async def bash(self, ctx: Ctx, args: BashArgs) -> StepOutcome:
        shell = ctx.state.shell
        if shell is None:
            shell = ctx.state.shell = await self._box(ctx).shell()
        return await self._bash(ctx, shell, args, ctx.state.limits)

    @tool("Read a text file (a byte range of it for large files).")
    async def read_file(self, ctx: Ctx, args: ReadFileArgs) -> StepOutcome:
        return await self._read(self._box(ctx), self.workdir(ctx.task), args, ctx.state.limits)

    @tool("Create or overwrite a file (parent directories are made).")
    async def write_file(self, ctx: Ctx, args: WriteFileArgs) -> StepOutcome:
        return await self._write(self._box(ctx), self.workdir(ctx.task), args)

    @tool("Replace an exact string in a file: `old` must match exactly once (or set replace_all).")
    async def edit_file(self, ctx: Ctx, args: EditFileArgs) -> StepOutcome:
        return await self._edit(self._box(ctx), self.workdir(ctx.task), args)

    @tool("List a directory: type, size and name of each entry.")
    async def list_dir(self, ctx: Ctx, args: ListDirArgs) -> StepOutcome:
        return await self._list(self._box(ctx), self.workdir(ctx.task), args, ctx.state.limits)

    @tool("End the episode; the hidden tests then judge the workdir.")
    async def submit(self, ctx: Ctx) -> StepOutcome:
        return StepOutcome(
            Observation(text="Submitted; the hidden tests now judge the working directory."),
            done=True,
            tool_ok=True,
            output_bytes=0,
        )

    async def _bash(
        self, ctx: Ctx, shell: ShellSession, args: BashArgs, limits: dict[str, float]
    ) -> StepOutcome:
        timeout = args.timeout if args.timeout is not None else limits["step_timeout_s"]
        cap = int(limits["max_output_bytes"])
        result = await shell.run(args.command, timeout=timeout, max_output=cap)
        marks = []
        if result.restarted:
            marks.append(
                "[the shell had exited (exit, exec or a kill); this command ran in a fresh "
                f"shell: cwd and variables were reset to the start ({self.workdir(ctx.task)})]"
            )
        # Did this command end the shell (`exit`, `exec`, a kill, or the timeout's last
        # resort)? A no-op says so at once (it restarts the shell) rather than one step late.
        probe = await shell.run(":", timeout=PROBE_TIMEOUT_S, max_output=cap)
        died = probe.restarted
        if died:
            marks.append(
                "[the shell ended during this command (exit, exec or a kill); a fresh shell "
                f"now runs: cwd and variables are back to the start ({probe.cwd})]"
            )
        late = probe.output  # a background job's output that arrived just now
        room = max(0, cap - len(result.output.encode("utf-8", errors="replace")))
        raw = late.encode("utf-8", errors="replace")
        if len(raw) > room:
            late = raw[len(raw) - room :].decode(errors="replace")
            result.truncated = True
        if result.timed_out:
            marks.append(
                f"[timed out after {timeout:g} s: the command and every process it started "
                "were killed]"
            )
        if result.truncated:
            marks.append(f"[output truncated: over {_format_bytes(cap)}; the middle was cut]")
        output = result.output + late
        text = output + ("" if not output or output.endswith("\n") else "\n")
        text += "\n".join(marks) + ("\n" if marks else "")
        cwd = probe.cwd if died else result.cwd
        text += f"[exit code: {result.exit_code} · cwd: {cwd}]"
        nbytes = len(output.encode("utf-8", errors="replace"))
        data = {
            "output": output,
            "exit_code": result.exit_code,
            "cwd": cwd,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
            "restarted": result.restarted,
            "shell_ended": died,
            "duration_s": round(result.duration_s, 4),
            "output_bytes": nbytes,
        }
        return StepOutcome(
            Observation(text=text, data=data),
            tool_ok=result.exit_code == 0 and not result.timed_out,
            timed_out=result.timed_out,
            output_bytes=nbytes,
        )

    @staticmethod
    def _path(workdir: str, path: str, *, allow_root: bool = False) -> str:
        """The one path rule (envs/paths.py): x, ./x, <workdir>/x; else a 422."""
        return workspace_abspath(path, workdir, allow_root=allow_root)

    @staticmethod
    def _failed(what: str, result: ExecResult, path: str) -> StepOutcome:
        reason = (result.stderr or result.stdout).strip() or f"exit {result.exit_code}"
        if result.timed_out:
            reason = "timed out"
        text = f"error: {what} {path}: {reason[-2000:]}"
        return StepOutcome(
            Observation(text=text, data={"error": reason[-2000:]}),
            tool_ok=False,
            timed_out=result.timed_out,
            output_bytes=len(text),
        )

    async def _read(
        self, box: Sandbox, workdir: str, args: ReadFileArgs, limits: dict[str, float]
    ) -> StepOutcome:
        path = self._path(workdir, args.path)
        cap = int(limits["max_output_bytes"])
        length = min(args.length or cap, cap)
        script = (
            'if [ -d "$1" ]; then echo "is a directory (use list_dir)" >&2; exit 2; fi; '
            'if [ -e "$1" ] && [ ! -f "$1" ]; then echo "not a regular file" >&2; exit 2; fi; '
            'size=$(wc -c <"$1") || exit 1; echo "$size"; '
            'tail -c +"$2" -- "$1" | head -c "$3"'
        )
        result = await box.exec(
            ["/bin/sh", "-c", script, "sh", path, str(args.offset + 1), str(length)],
            cwd=workdir,
            timeout=30,
            max_output=length + 64,
        )
        if not result.ok:
            return self._failed("cannot read", result, path)
        head, _, content = result.stdout.partition("\n")
        size = int(head.strip() or 0)
        end = args.offset + len(content.encode("utf-8", errors="replace"))
        text = content
        truncated = end < size
        if truncated:
            text += f"\n[truncated: bytes {args.offset}-{end} of {size}; read on with offset={end}]"
        data = {"path": path, "size": size, "offset": args.offset, "truncated": truncated}
        nbytes = len(content.encode("utf-8", errors="replace"))
        return StepOutcome(Observation(text=text, data=data), tool_ok=True, output_bytes=nbytes)

    async def _put(self, box: Sandbox, workdir: str, path: str, content: str) -> ExecResult:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat >"$1"'
        return await box.exec(
            ["/bin/sh", "-c", script, "sh", path], cwd=workdir, stdin=content, timeout=30
        )

    async def _write(self, box: Sandbox, workdir: str, args: WriteFileArgs) -> StepOutcome:
        path = self._path(workdir, args.path)
        result = await self._put(box, workdir, path, args.content)
        if not result.ok:
            return self._failed("cannot write", result, path)
        text = f"wrote {len(args.content.encode())} bytes to {path}"
        return StepOutcome(
            Observation(text=text, data={"path": path}), tool_ok=True, output_bytes=0
        )

    async def _edit(self, box: Sandbox, workdir: str, args: EditFileArgs) -> StepOutcome:
        path = self._path(workdir, args.path)
        script = (
            'if [ -d "$1" ]; then echo "is a directory" >&2; exit 2; fi; '
            'if [ -e "$1" ] && [ ! -f "$1" ]; then echo "not a regular file" >&2; exit 2; fi; '
            'cat -- "$1"'
        )
        result = await box.exec(
            ["/bin/sh", "-c", script, "sh", path],
            cwd=workdir,
            timeout=30,
            max_output=MAX_EDIT_BYTES + 1,
        )
        if not result.ok:
            return self._failed("cannot edit", result, path)

        def refuse(message: str) -> StepOutcome:
            text = f"error: {message}"
            return StepOutcome(
                Observation(text=text, data={"error": message, "path": path}),
                tool_ok=False,
                output_bytes=len(text),
            )

        if result.truncated or len(result.stdout.encode()) > MAX_EDIT_BYTES:
            return refuse(f"{path} is larger than {_format_bytes(MAX_EDIT_BYTES)}; use bash")
        content = result.stdout
        if "\ufffd" in content and "\ufffd" not in args.old:
            return refuse(f"{path} is not UTF-8 text; edit it with bash")
        count = content.count(args.old)
        if count == 0:
            return refuse(
                f"`old` was not found in {path}; it must match the file exactly (whitespace and "
                "indentation included): read_file it first"
            )
        if count > 1 and not args.replace_all:
            return refuse(
                f"`old` matches {count} places in {path}; include more surrounding text so it "
                "matches once, or set replace_all=true"
            )
        updated = content.replace(args.old, args.new)
        result = await self._put(box, workdir, path, updated)
        if not result.ok:
            return self._failed("cannot write", result, path)
        text = f"replaced {count} occurrence{'s' if count > 1 else ''} in {path}"
        return StepOutcome(
            Observation(text=text, data={"path": path, "replacements": count}),
            tool_ok=True,
            output_bytes=0,
        )

    async def _list(
        self, box: Sandbox, workdir: str, args: ListDirArgs, limits: dict[str, float]
    ) -> StepOutcome:
        path = self._path(workdir, args.path, allow_root=True)
        script = (
            'if [ ! -d "$1" ]; then echo "not a directory" >&2; exit 2; fi; '
            'find -H "$1" -mindepth 1 -maxdepth "$2" -printf "%P\\t%y\\t%s\\n" 2>/dev/null '
            f"| LC_ALL=C sort | head -n {MAX_LIST + 1}"
        )
        result = await box.exec(
            ["/bin/sh", "-c", script, "sh", path, str(args.depth)],
            cwd=workdir,
            timeout=30,
            max_output=int(limits["max_output_bytes"]),
        )
        if not result.ok:
            return self._failed("cannot list", result, path)
        kinds = {"f": "file", "d": "dir", "l": "link"}
        entries = []
        for line in result.stdout.splitlines():
            parts = line.rsplit("\t", 2)
            if len(parts) != 3:
                continue
            name, kind, size = parts
            entries.append({"name": name, "type": kinds.get(kind, "other"), "size": int(size or 0)})
        more = len(entries) > MAX_LIST
        entries = entries[:MAX_LIST]
        lines = [
            f"{e['name']}{'/' if e['type'] == 'dir' else ''}"
            + (f"  ({e['size']} bytes)" if e["type"] == "file" else "")
            + ("  -> link" if e["type"] == "link" else "")
            for e in entries
        ]
        text = "\n".join(lines) if lines else "(empty)"
        if more:
            text += f"\n[truncated: more than {MAX_LIST} entries; list a subdirectory]"
        data = {"path": path, "entries": entries, "truncated": more}
        return StepOutcome(
            Observation(text=f"{path}:\n{text}", data=data),
            tool_ok=True,
            output_bytes=len(text),
        )

    # -- verification ---------------------------------------------------------------------
    async def verify(self, ctx: Ctx) -> Assessment:
        task = ctx.task
        public, private = TerminalPublic.of(task), TerminalPrivate.of(task)
        shell, ctx.state.shell = ctx.state.shell, None
        if shell is not None:
            await shell.close()
        box = ctx.sandboxes.episode
        if box is None:
            raise SandboxError("the episode's sandbox is gone; nothing to verify")
        # The workspace waits in a file on the server's disk, never whole in its memory; one
        # over the sandbox's limit is the agent's (SandboxFileTooLarge: reward 0).
        with ctx.sandboxes.spool() as workspace:
            try:
                await box.download_tar_to(workspace)
            finally:
                # Every process the agent started dies with its sandbox, before any test runs.
                await ctx.sandboxes.retire_episode()
            fresh = await self._verifier_sandbox(ctx, private.verifier_image)
            site = b""  # the test-time installs, from a sandbox of their own (no agent file)
            if private.verifier_installs:
                wants = private.verifier_installs, private.verifier_hosts
                site = await testinstall.install_for(ctx.sandboxes, fresh, *wants)
            run = await verifier.verify_workspace(
                fresh,
                workspace,
                workdir=public.workdir,
                verifier=private.verifier,
                environment=public.environment,
                fail_to_pass=private.fail_to_pass,
                pass_to_pass=private.pass_to_pass,
                timeout_s=private.verifier_timeout_s or public.timeout_s or 120.0,
                path=public.env.get("PATH") or BASE_PATH,
                reward_file=private.reward_file,
                spool=ctx.sandboxes.spool_dir,
                verifier_blobs=task.blobs_of("verifier"),
                site=site,
            )
        reward = run.reward
        return Assessment(
            reward=reward,
            passed=reward >= 1.0,
            components=run.components,
            feedback=run.feedback(),
        )

    async def _verifier_sandbox(self, ctx: Ctx, image: str | None) -> Sandbox:
        """A fresh sandbox on the task's verifier image, else on the agent's spec (its image
        included). A backend that has no such image at all (bwrap without its rootfs) falls
        back to the agent's; docker without the built image voids (`SandboxCreateError`
        says which `palaestra images build` makes it)."""
        if image is None:
            return await ctx.sandboxes.verifier(traces_execs=True)
        own = self.sandbox_spec(ctx.task)
        assert own is not None  # the terminal family always asks for a sandbox
        spec = dataclasses.replace(own, image=image)
        try:
            return await ctx.sandboxes.verifier(spec, traces_execs=True)
        except SandboxSpecError:
            return await ctx.sandboxes.verifier(traces_execs=True)

    # -- oracle, null, cheats -------------------------------------------------------------
    def oracle(self, task: Task) -> list[Action]:
        script = TerminalPrivate.of(task).solution.get("solve.sh")
        if script is None:
            raise KeyError(f"task {task.id} has no solution/solve.sh")
        timeout = min(TerminalPublic.of(task).timeout_s or 120.0, MAX_STEP_S)
        return [
            Action(
                tool="bash",
                arguments={"command": f"bash -c {shlex.quote(script)}", "timeout": timeout},
            ),
            Action(tool="submit", arguments={}),
        ]

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        return cheats.for_task(task)
