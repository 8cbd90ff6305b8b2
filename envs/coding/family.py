"""The `coding` family: write a Python function, try it, submit; hidden tests decide.

Public fields: `prompt` (signature and docstring), `entry_point`. Private fields:
`tests` (HumanEval's `check(candidate)` code) and `solution` (the canonical body). A pack's
directory form may give them as files instead: `verifier/tests.py` (the `check` code) and
`solution/solution.py` (the whole reference file).
The agent works in `/work`; its answer is `solution.py` there. Verification copies
only that file into a fresh sandbox, stages the hidden tests, and runs them.
"""

from __future__ import annotations

import time

from pydantic import Field

from palaestra.envs.base import EpisodeContext, Family, NoArgs, StepOutcome, Tool, ToolArgs
from palaestra.envs.coding import cheats
from palaestra.envs.coding.examples import EXAMPLES_RUNNER, examples_input, public_examples
from palaestra.envs.paths import workspace_relpath
from palaestra.sandbox import AgentFault, ExecResult, Sandbox, SandboxSpec
from palaestra.sandbox.base import DEFAULT_MAX_OUTPUT
from palaestra.sandbox.forkserver import ForkServerUnavailable
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Action, Observation, Verdict, VerifierInfo
from palaestra.sdk.task import Task
from palaestra.verifiers import python_tests

SOLUTION = "solution.py"
WORKDIR = "/work"
MAX_SOLUTION_BYTES = 4 << 20  # far above any function's source; more is the agent's fault
EXAMPLES_TIMEOUT_S = 20.0
PYTHON = python_tests.PYTHON


class WriteFileArgs(ToolArgs):
    path: str = Field(
        min_length=1, max_length=255, description="x, ./x or /work/x: a file inside /work"
    )
    content: str = Field(max_length=1_000_000)


class RunPythonArgs(ToolArgs):
    code: str | None = Field(default=None, max_length=200_000, description="Python source to run")
    path: str | None = Field(default=None, max_length=255, description="or a file in /work to run")
    timeout: float = Field(default=10.0, gt=0, le=60)


TOOLS = (
    Tool("write_file", "Write a text file in the working directory /work.", WriteFileArgs),
    Tool(
        "run_python",
        "Run Python code (or a file) in the sandbox; returns exit code and output.",
        RunPythonArgs,
    ),
    Tool("run_tests", "Run the public examples from the docstring against solution.py.", NoArgs),
    Tool("submit", "End the episode: solution.py is graded by hidden tests.", NoArgs),
)


TESTS_FILE = "tests.py"


def task_tests(task: Task) -> str:
    """The hidden `check(candidate)` code: `private.tests`, or the pack's verifier/tests.py."""
    tests = task.private.get("tests")
    if isinstance(tests, str):
        return tests
    files = task.private.get("verifier") or {}
    if TESTS_FILE not in files:
        raise KeyError(f"task {task.id} has neither private.tests nor verifier/{TESTS_FILE}")
    return str(files[TESTS_FILE])


def task_solution(task: Task) -> str:
    """The reference solution.py: solution/solution.py, or the prompt plus the canonical body."""
    solution = task.private["solution"]
    if isinstance(solution, dict):
        return str(solution[SOLUTION])
    return str(task.public["prompt"]) + str(solution)


def _format(result: ExecResult) -> Observation:
    parts = [f"exit code: {result.exit_code}"]
    if result.timed_out:
        parts.append("(timed out: every process was killed)")
    if result.truncated:
        parts.append("(output truncated)")
    text = " ".join(parts)
    if result.stdout:
        text += f"\n--- stdout ---\n{result.stdout}"
    if result.stderr:
        text += f"\n--- stderr ---\n{result.stderr}"
    data = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
    }
    return Observation(text=text, data=data)


class CodingFamily(Family):
    name = "coding"
    description = "Function-level Python tasks graded by hidden unit tests."
    version = "0.1.0"
    tools = TOOLS

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        return SandboxSpec(workspace_mb=32, memory_mb=1024, default_timeout_s=10.0)

    async def reset(self, ctx: EpisodeContext) -> Observation:
        prompt = ctx.task.public["prompt"]
        entry = ctx.task.public["entry_point"]
        text = (
            f"Implement the Python function `{entry}`.\n\n```python\n{prompt}```\n\n"
            f"Write the complete function (signature included, with any imports it needs) "
            f"to {SOLUTION} with write_file. You may try it with run_python and run_tests "
            f"(the docstring's examples). Call submit when done: hidden tests grade {SOLUTION}."
        )
        return Observation(text=text, data={"entry_point": entry, "solution_path": SOLUTION})

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        sandbox = ctx.sandbox
        assert sandbox is not None
        if isinstance(args, WriteFileArgs):
            path = workspace_relpath(args.path, WORKDIR)
            await sandbox.write_file(path, args.content)
            return StepOutcome(Observation(text=f"wrote {len(args.content)} characters to {path}"))
        if isinstance(args, RunPythonArgs):
            if (args.code is None) == (args.path is None):
                raise InvalidActionError("run_python needs exactly one of `code` or `path`")
            argv = (
                [PYTHON, "-c", args.code]
                if args.code is not None
                else [PYTHON, "./" + workspace_relpath(args.path or "", WORKDIR)]
            )
            return StepOutcome(_format(await sandbox.exec(argv, timeout=args.timeout)))
        if tool.name == "run_tests":
            examples = examples_input(ctx.task.public["prompt"], ctx.task.public["entry_point"])
            if not examples:
                return StepOutcome(
                    Observation(
                        text="The docstring has no examples in doctest form; use run_python."
                    )
                )
            return StepOutcome(_format(await self._run_examples(ctx, sandbox, examples)))
        if tool.name == "submit":
            return StepOutcome(Observation(text="Submitted; grading solution.py."), done=True)
        raise InvalidActionError(f"tool {tool.name!r} is not handled")  # pragma: no cover

    async def _run_examples(
        self, ctx: EpisodeContext, sandbox: Sandbox, examples: str
    ) -> ExecResult:
        """The examples against solution.py, in a one-shot sandbox from the fork server that
        holds solution.py alone, as the grader sees it (a fork costs a third of a fresh
        interpreter in a fresh jail); in the episode's sandbox where there is no fork server."""
        if ctx.run_python is not None:
            try:
                files = {SOLUTION: await sandbox.read_file(SOLUTION)}
            except FileNotFoundError:
                files = {}  # the runner reports it, as it would in the sandbox
            if len(files.get(SOLUTION, b"")) > MAX_SOLUTION_BYTES:
                raise InvalidActionError(
                    f"{SOLUTION} is over {MAX_SOLUTION_BYTES} bytes; write the function alone"
                )
            spec = self.sandbox_spec(ctx.task)
            try:
                return await ctx.run_python(
                    EXAMPLES_RUNNER,
                    files=files,
                    stdin=examples.encode(),
                    timeout=EXAMPLES_TIMEOUT_S,
                    max_output=DEFAULT_MAX_OUTPUT,
                    memory_mb=spec.memory_mb,
                    workspace_mb=spec.workspace_mb,
                )
            except ForkServerUnavailable:
                pass  # logged once by the fork server
        return await sandbox.exec(
            [PYTHON, "-c", EXAMPLES_RUNNER], stdin=examples, timeout=EXAMPLES_TIMEOUT_S
        )

    async def verify(self, ctx: EpisodeContext) -> Verdict:
        """Reward 1 when every hidden test passes, else 0 (docs/decisions.md: a fraction of
        tests pays constant and echo answers on many tasks); `tests_passed` is the fraction.
        Whatever the agent left instead of a solution is a 0 with a failure class."""
        started = time.perf_counter()
        info = VerifierInfo(name="python-hidden-tests", version=python_tests.VERSION)

        def zero(failure: str, feedback: str) -> Verdict:
            return Verdict(
                reward=0.0,
                passed=False,
                failure=failure,
                components={"tests_passed": 0.0},
                feedback=feedback,
                verifier=info,
                task_digest=ctx.task.digest,
                duration_s=time.perf_counter() - started,
            )

        assert ctx.sandbox is not None
        try:
            solution = await ctx.sandbox.read_file(SOLUTION)
        except FileNotFoundError:
            return zero("missing_file", f"no {SOLUTION} was written")
        except AgentFault as exc:  # a directory, symlink, fifo, sparse giant: the agent's
            return zero(exc.failure, f"{SOLUTION} is not a readable regular file: {exc}")
        if len(solution) > MAX_SOLUTION_BYTES:
            return zero("too_large", f"{SOLUTION} is over {MAX_SOLUTION_BYTES} bytes")
        plan = python_tests.split_tests(task_tests(ctx.task))
        spec = self.sandbox_spec(ctx.task)
        run: python_tests.TestRun | None = None
        if ctx.run_python is not None:
            try:
                run = await python_tests.run_python_tests(
                    None,
                    solution_path=SOLUTION,
                    plan=plan,
                    entry_point=ctx.task.public["entry_point"],
                    context=ctx.task.public["prompt"],
                    run_python=ctx.run_python,
                    solution=solution,
                    memory_mb=spec.memory_mb,
                    workspace_mb=spec.workspace_mb,
                )
            except ForkServerUnavailable:
                run = None  # logged once by the fork server; use a bwrap sandbox
        if run is None:
            async with await ctx.new_sandbox(spec) as fresh:
                await fresh.write_file(SOLUTION, solution)
                run = await python_tests.run_python_tests(
                    fresh,
                    solution_path=SOLUTION,
                    plan=plan,
                    entry_point=ctx.task.public["entry_point"],
                    context=ctx.task.public["prompt"],
                )
        examples = public_examples(ctx.task.public["prompt"], ctx.task.public["entry_point"])
        fraction = run.hidden_fraction(python_tests.public_duplicates(plan, examples))
        passed = run.all_passed
        return Verdict(
            reward=1.0 if passed else 0.0,
            passed=passed,
            failure=run.failure,
            components={"tests_passed": fraction},
            feedback=run.summary(),
            verifier=info,
            task_digest=ctx.task.digest,
            duration_s=time.perf_counter() - started,
        )

    def oracle(self, task: Task) -> list[Action]:
        return _write_and_submit(task_solution(task))

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        entry = str(task.public["entry_point"])
        return [
            (
                "docstring-examples",
                _write_and_submit(cheats.examples_only(task.public["prompt"], entry)),
            ),
            ("always-equal", _write_and_submit(cheats.ALWAYS_EQUAL.format(entry=entry))),
            ("print-pass", _write_and_submit(cheats.PRINT_PASS.format(entry=entry))),
            ("exit-zero", _write_and_submit(cheats.EXIT_ZERO)),
            *((name, _write_and_submit(src)) for name, src in cheats.degenerate(entry)),
        ]


def _write_and_submit(source: str) -> list[Action]:
    return [
        Action(tool="write_file", arguments={"path": SOLUTION, "content": source}),
        Action(tool="submit", arguments={}),
    ]
