"""The `cad` family: write a script that builds a solid; geometry decides the reward.

Public fields: `instruction` (the part in words and numbers), `params`, `parametric`,
`script` (part.py), `output` (out.stl). Private: `domain`, `params` and, for parametric
tasks, `hidden_params`. The agent works in /work: `write_file`, `run_script` (runs a script
in the sandbox under the trimesh or the Blender toolchain and reports the exported mesh),
`render` (a PNG of out.stl from four fixed views), `submit`.

Verification never trusts the workspace's out.stl: it copies the workspace into a fresh
sandbox, deletes every out.stl, runs the script again (the last one run, with its
toolchain) and reads the mesh it writes; a parametric task runs it once more with hidden
parameter values. The meshes are scored on the server, in a thread, by
`palaestra.verifiers.mesh` against the reference solid rebuilt from the private parameters.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from pydantic import Field

from palaestra.envs import (
    Action,
    AgentFault,
    Assessment,
    EpisodeContext,
    ExecResult,
    Family,
    InvalidActionError,
    Observation,
    Sandbox,
    SandboxSpec,
    State,
    StepOutcome,
    Task,
    TaskFieldsError,
    ToolArgs,
    VerifierInfo,
    tool,
    workspace_relpath,
)
from palaestra.envs.cad import cheats, runtime
from palaestra.envs.cad.fields import CadPrivate, CadPublic
from palaestra.envs.cad.tasks import OUTPUT, PARAMS_FILE, SCRIPT
from palaestra.verifiers import mesh as mesh_verifier

MAX_TAIL = 4000
IMAGE = "cad"  # images/cad/Dockerfile
VERIFY_TIMEOUT_S = 180.0


class WriteFileArgs(ToolArgs):
    path: str = Field(min_length=1, max_length=255, description="a path relative to /work")
    content: str = Field(max_length=8_000_000)


class RunScriptArgs(ToolArgs):
    path: str = Field(default=SCRIPT, max_length=255, description="the script, in /work")
    toolchain: Literal["trimesh", "blender"] = Field(
        default="trimesh",
        description="trimesh: python3 with trimesh, manifold3d, numpy 2; "
        "blender: python3 with bpy 5.0.1 (numpy < 2)",
    )
    timeout: float = Field(default=60.0, gt=0, le=300, description="seconds")


def _workspace_path(path: str) -> str:
    """The one path rule (envs/paths.py): x, ./x, /work/x; else a 422."""
    return workspace_relpath(path, "/work")


def _tail(text: str) -> str:
    return text if len(text) <= MAX_TAIL else "…" + text[-MAX_TAIL:]


def _run_text(result: ExecResult, path: str) -> str:
    parts = [f"{path}: exit code {result.exit_code}"]
    if result.timed_out:
        parts.append("(timed out: every process was killed; make the script faster)")
    if result.oom_killed:
        parts.append("(killed: out of memory; use fewer or smaller meshes)")
    if result.truncated:
        parts.append("(output truncated)")
    text = " ".join(parts)
    if result.stdout:
        text += f"\n--- stdout ---\n{_tail(result.stdout)}"
    if result.stderr:
        text += f"\n--- stderr ---\n{_tail(result.stderr)}"
    return text


async def run_in(
    sandbox: Sandbox, path: str, chain: runtime.Toolchain, timeout: float
) -> tuple[ExecResult, bytes | None]:
    """Delete any old out.stl, run `path` under `chain`, return the result and the new mesh."""
    await sandbox.exec(["rm", "-f", OUTPUT], timeout=10)
    result = await sandbox.exec(
        [runtime.PYTHON, path], timeout=timeout, env=chain.env(), max_output=256 * 1024
    )
    try:
        data = await sandbox.read_file(OUTPUT)
    except (FileNotFoundError, AgentFault):  # none, or a dir/fifo/symlink: no mesh
        data = None
    return result, data


class CadState(State):
    """The last script run and its toolchain: what the verifier runs again."""

    script: str = SCRIPT
    toolchain: Literal["trimesh", "blender"] = "trimesh"


Ctx = EpisodeContext[CadState]


class CadFamily(Family[CadState]):
    name = "cad"
    description = "Build a solid part with trimesh/manifold3d or Blender; verified by geometry."
    version = "1.0.0"
    public_fields = CadPublic
    private_fields = CadPrivate
    image = IMAGE  # docker: images/cad (bpy's X and GL libraries); bwrap: the host's /usr

    def node_labels(self, task: Task) -> frozenset[str]:
        """Any step may pick the Blender toolchain: a node needs both toolchains (`bpy`)."""
        return frozenset({"bpy"})

    def sandbox_spec(self, task: Task) -> SandboxSpec | None:
        return SandboxSpec(
            workspace_mb=256,
            memory_mb=2048,
            pids=512,
            default_timeout_s=60.0,
            ro_binds=runtime.ro_binds(self.server.toolchains),
        )

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if CadPublic.of(task).parametric and not CadPrivate.of(task).hidden_params:
            raise TaskFieldsError(task, "private.hidden_params: a parametric task needs them")

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="cad-mesh", version=mesh_verifier.VERSION)

    async def reset(self, ctx: Ctx) -> Observation:
        public = CadPublic.of(ctx.task)
        sandbox = ctx.sandboxes.episode
        assert sandbox is not None
        if public.parametric:
            await sandbox.write_file(PARAMS_FILE, json.dumps(public.params, indent=2))
        chains = {c: runtime.toolchain(c, self.server.toolchains) for c in runtime.TOOLCHAINS}
        off = [f"{c} ({t.reason})" for c, t in chains.items() if not t.available]
        text = public.instruction + "\n\nParameters: " + json.dumps(public.params)
        if off:
            text += "\nUnavailable on this server: " + "; ".join(off)
        data = {
            "params": public.params,
            "parametric": public.parametric,
            "script": SCRIPT,
            "output": OUTPUT,
            "toolchains": [c for c, t in chains.items() if t.available],
        }
        return Observation(text=text, data=data)

    @staticmethod
    def _sandbox(ctx: Ctx) -> Sandbox:
        sandbox = ctx.sandboxes.episode
        assert sandbox is not None
        return sandbox

    @tool("Write a text file in the working directory /work.")
    async def write_file(self, ctx: Ctx, args: WriteFileArgs) -> StepOutcome:
        path = _workspace_path(args.path)
        await self._sandbox(ctx).write_file(path, args.content)
        return StepOutcome(Observation(text=f"wrote {len(args.content)} characters to {path}"))

    @tool(
        f"Run a Python script in the sandbox; it should write {OUTPUT}. Returns its exit "
        "code and output and a summary of the mesh: watertight, volume, bounds, bodies, "
        "genus and problems."
    )
    async def run_script(self, ctx: Ctx, args: RunScriptArgs) -> StepOutcome:
        return StepOutcome(await self._run_script(ctx, self._sandbox(ctx), args))

    @tool(f"A PNG of {OUTPUT} from four fixed views (iso, front, right, top).")
    async def render(self, ctx: Ctx) -> StepOutcome:
        return StepOutcome(await self._render(self._sandbox(ctx)))

    @tool("End the episode: the last script run is run again and its solid graded.")
    async def submit(self, ctx: Ctx) -> StepOutcome:
        return StepOutcome(
            Observation(text="Submitted; running the script again to grade it."), done=True
        )

    async def _run_script(self, ctx: Ctx, sandbox: Sandbox, args: RunScriptArgs) -> Observation:
        path = _workspace_path(args.path)
        chain = runtime.toolchain(args.toolchain, self.server.toolchains)
        if not chain.available:
            raise InvalidActionError(
                f"the {args.toolchain} toolchain is unavailable on this server: {chain.reason}"
            )
        try:
            await sandbox.read_file(path)
        except FileNotFoundError:
            raise InvalidActionError(f"no file {path} in /work; write it first") from None
        result, data = await run_in(sandbox, path, chain, args.timeout)
        ctx.state.script, ctx.state.toolchain = path, args.toolchain
        text = _run_text(result, path)
        info: dict[str, Any] = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "oom_killed": result.oom_killed,
        }
        if data is None:
            text += f"\nno {OUTPUT} was written: the script must save the solid to {OUTPUT}"
            info["mesh"] = None
        else:
            summary, _ = await asyncio.to_thread(mesh_verifier.summarize, data)
            text += "\n" + summary.text()
            info["mesh"] = summary.__dict__
        return Observation(text=text, data=info)

    async def _render(self, sandbox: Sandbox) -> Observation:
        try:
            data = await sandbox.read_file(OUTPUT)
        except FileNotFoundError:
            return Observation(text=f"nothing to render: no {OUTPUT}; run a script first")
        png, message = await asyncio.to_thread(_render_sync, data)
        if png is None:
            return Observation(text=f"cannot render {OUTPUT}: {message}")
        return Observation(text=f"{OUTPUT}: {message}", images=[png])

    async def verify(self, ctx: Ctx) -> Assessment:
        sandbox = self._sandbox(ctx)
        path = ctx.state.script
        chain = runtime.toolchain(ctx.state.toolchain, self.server.toolchains)
        private = CadPrivate.of(ctx.task)

        def verdict(
            reward: float,
            passed: bool,
            comps: dict[str, float],
            fb: str,
            failure: str | None = None,
        ) -> Assessment:
            return Assessment(
                reward=reward,
                passed=passed,
                failure=failure if reward == 0.0 else None,
                components=comps,
                feedback=fb,
            )

        try:
            await sandbox.read_file(path)
        except FileNotFoundError:
            return verdict(
                0.0, False, {"gate": 0.0}, f"no script {path} was written", "missing_file"
            )
        if not chain.available:  # an infrastructure fault: void, never 0
            raise RuntimeError(f"toolchain {chain.name} unavailable: {chain.reason}")
        # The agent's workspace goes to the fresh sandbox through a file on the server's
        # disk, never whole in its memory; one over the limit is the agent's (reward 0).
        with ctx.sandboxes.spool() as workspace:
            await sandbox.download_tar_to(workspace)
            fresh = await ctx.sandboxes.verifier()
            await fresh.upload_tar_from(workspace)
        runs = [("", private.params)]
        if CadPublic.of(ctx.task).parametric:
            runs.append(("hidden_", private.hidden_params))
        comps: dict[str, float] = {}
        rewards, notes, passed = [], [], True
        failure: str | None = None  # the first run's that failed as a whole
        for prefix, params in runs:
            await fresh.write_file(PARAMS_FILE, json.dumps(params, indent=2))
            result, data = await run_in(fresh, path, chain, VERIFY_TIMEOUT_S)
            label = "hidden parameters" if prefix else "task parameters"
            if not result.ok:
                await _preflight(fresh, chain)
            if not result.ok or data is None:
                why = "no mesh written" if result.ok else f"exit code {result.exit_code}"
                if result.timed_out:
                    why = "timed out"
                failure = failure or (
                    "timeout"
                    if result.timed_out
                    else "oom"
                    if result.oom_killed
                    else "missing_file"
                    if result.ok
                    else "crash"
                )
                rewards.append(0.0)
                passed = False
                comps[f"{prefix}gate"] = 0.0
                notes.append(f"{label}: the script failed ({why}): {_tail(result.stderr)}")
                continue
            report = await asyncio.to_thread(score_mesh, private.domain, params, data)
            rewards.append(report.reward)
            passed = passed and report.passed
            comps.update({prefix + k: v for k, v in report.components.items()})
            notes.append(f"{label}: {report.feedback}")
        reward = min(rewards)
        if len(runs) > 1:
            comps["hidden_rerun"] = rewards[1]
        return verdict(reward, passed, comps, " | ".join(notes), failure)

    def oracle(self, task: Task) -> list[Action]:
        return cheats.write_run_submit(cheats.oracle_script(task))

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        return cheats.all_cheats(task)


async def _preflight(sandbox: Sandbox, chain: runtime.Toolchain) -> None:
    """After a failed run: if the toolchain itself does not import in the sandbox, that is an
    infrastructure fault (a backend without the binds, a broken venv): raise, so the episode
    is void rather than 0. A script's own import errors are its own."""
    modules = "bpy" if chain.name == "blender" else "numpy, trimesh, manifold3d"
    check = await sandbox.exec(
        [runtime.PYTHON, "-c", f"import {modules}"], timeout=120, env=chain.env()
    )
    if not check.ok:
        raise RuntimeError(
            f"the {chain.name} toolchain does not import in the sandbox: {_tail(check.stderr)}"
        )


def score_mesh(domain: str, params: dict[str, Any], data: bytes) -> mesh_verifier.MeshReport:
    from palaestra.envs.cad import reference  # builds with manifold3d: imported when needed

    return mesh_verifier.verify_mesh(data, reference.reference(domain, params))


def _render_sync(data: bytes) -> tuple[str | None, str]:
    from palaestra.envs.cad.render import render_b64

    summary, mesh = mesh_verifier.summarize(data)
    if mesh is None:
        return None, "; ".join(summary.errors)
    try:
        return render_b64(mesh), summary.text()
    except ValueError as exc:
        return None, str(exc)
