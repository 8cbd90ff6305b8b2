"""The `coding` family: write a Python function, try it, submit; hidden tests decide.

Public fields: `prompt` (signature and docstring), `entry_point`. Private fields:
`tests` (HumanEval's `check(candidate)` code) and `solution` (the canonical body). A pack's
directory form may give them as files instead: `verifier/tests.py` (the `check` code) and
`solution/solution.py` (the whole reference file).
The agent works in `/work`; its answer is `solution.py` there (write_file takes
`solution.py`, `./solution.py` or `/work/solution.py`). Verification copies only that file
into a fresh sandbox, stages the hidden tests, and runs them.

Accepted forms of solution.py, graded as HumanEval's `check_correctness` grades "prompt plus
completion" (bench/humaneval_agreement.py measures the agreement):
- the prompt runs first, then the file: the file may be the entry function alone and use
  the prompt's imports and helpers (`List`, `is_palindrome`); its own definitions win;
- the file is read as Python reads a source file: UTF-8, with or without a byte-order mark,
  or in the encoding its coding cookie names; LF, CRLF or CR line ends; spaces or tabs;
- returns are compared as plain values: a subclass of a builtin (a Counter, an OrderedDict,
  a namedtuple, an IntEnum, a subclass of str or list...) counts as its base value, read
  through the base type's own slots, so a subclass's own `__eq__`, `__iter__` or `items`
  is never consulted (docs/reference/verifiers.md, "Coding: prompt plus completion, and
  subclass returns").
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from palaestra.envs import (
    DEFAULT_MAX_OUTPUT,
    Action,
    AgentFault,
    Assessment,
    EpisodeContext,
    ExecResult,
    Family,
    InvalidActionError,
    Observation,
    PrivateFields,
    PublicFields,
    PythonRun,
    Sandbox,
    SandboxSpec,
    StepOutcome,
    Task,
    ToolArgs,
    VerifierInfo,
    tool,
    workspace_relpath,
)
from palaestra.envs.coding import cheats
from palaestra.envs.coding.examples import EXAMPLES_RUNNER, examples_input, public_examples
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


TESTS_FILE = "tests.py"


class CodingPublic(PublicFields):
    prompt: str  # the signature and docstring
    entry_point: str


class CodingPrivate(PrivateFields):
    tests: str | None = None  # HumanEval's `check(candidate)` code
    verifier: dict[str, str] = Field(default_factory=dict)  # or verifier/tests.py
    solution: str | dict[str, str]  # the canonical body, or solution/solution.py

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.tests is None and TESTS_FILE not in self.verifier:
            raise ValueError(f"neither private.tests nor verifier/{TESTS_FILE} is given")
        if isinstance(self.solution, dict) and SOLUTION not in self.solution:
            raise ValueError(f"solution/ has no {SOLUTION}")
        return self


def task_tests(task: Task) -> str:
    """The hidden `check(candidate)` code: `private.tests`, or the pack's verifier/tests.py."""
    private = CodingPrivate.of(task)
    return private.tests if private.tests is not None else private.verifier[TESTS_FILE]


def task_solution(task: Task) -> str:
    """The reference solution.py: solution/solution.py, or the prompt plus the canonical body."""
    solution = CodingPrivate.of(task).solution
    if isinstance(solution, dict):
        return solution[SOLUTION]
    return CodingPublic.of(task).prompt + solution


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
    public_fields = CodingPublic
    private_fields = CodingPrivate

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        return SandboxSpec(workspace_mb=32, memory_mb=1024, default_timeout_s=10.0)

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="python-hidden-tests", version=python_tests.VERSION)

    async def reset(self, ctx: EpisodeContext) -> Observation:
        public = CodingPublic.of(ctx.task)
        prompt, entry = public.prompt, public.entry_point
        text = (
            f"Implement the Python function `{entry}`.\n\n```python\n{prompt}```\n\n"
            f"Write the complete function (signature included, with any imports it needs) "
            f"to {SOLUTION} with write_file. You may try it with run_python and run_tests "
            f"(the docstring's examples). Call submit when done: hidden tests grade {SOLUTION}."
        )
        return Observation(text=text, data={"entry_point": entry, "solution_path": SOLUTION})

    @staticmethod
    def _sandbox(ctx: EpisodeContext) -> Sandbox:
        sandbox = ctx.sandboxes.episode
        assert sandbox is not None
        return sandbox

    @tool("Write a text file in the working directory /work.")
    async def write_file(self, ctx: EpisodeContext, args: WriteFileArgs) -> StepOutcome:
        path = workspace_relpath(args.path, WORKDIR)
        await self._sandbox(ctx).write_file(path, args.content)
        return StepOutcome(Observation(text=f"wrote {len(args.content)} characters to {path}"))

    @tool("Run Python code (or a file) in the sandbox; returns exit code and output.")
    async def run_python(self, ctx: EpisodeContext, args: RunPythonArgs) -> StepOutcome:
        if (args.code is None) == (args.path is None):
            raise InvalidActionError("run_python needs exactly one of `code` or `path`")
        argv = (
            [PYTHON, "-c", args.code]
            if args.code is not None
            else [PYTHON, "./" + workspace_relpath(args.path or "", WORKDIR)]
        )
        return StepOutcome(_format(await self._sandbox(ctx).exec(argv, timeout=args.timeout)))

    @tool("Run the public examples from the docstring against solution.py.")
    async def run_tests(self, ctx: EpisodeContext) -> StepOutcome:
        public = CodingPublic.of(ctx.task)
        examples = examples_input(public.prompt, public.entry_point)
        if not examples:
            return StepOutcome(
                Observation(text="The docstring has no examples in doctest form; use run_python.")
            )
        return StepOutcome(_format(await self._run_examples(ctx, self._sandbox(ctx), examples)))

    @tool("End the episode: solution.py is graded by hidden tests.")
    async def submit(self, ctx: EpisodeContext) -> StepOutcome:
        return StepOutcome(Observation(text="Submitted; grading solution.py."), done=True)

    async def _run_examples(
        self, ctx: EpisodeContext, sandbox: Sandbox, examples: str
    ) -> ExecResult:
        """The examples against solution.py, in a one-shot sandbox that holds solution.py
        alone, as the grader sees it."""
        try:
            files = {SOLUTION: await sandbox.read_file(SOLUTION)}
        except FileNotFoundError:
            files = {}  # the runner reports it, as it would in the sandbox
        if len(files.get(SOLUTION, b"")) > MAX_SOLUTION_BYTES:
            raise InvalidActionError(
                f"{SOLUTION} is over {MAX_SOLUTION_BYTES} bytes; write the function alone"
            )
        spec = self.sandbox_spec(ctx.task)
        job = PythonRun(
            EXAMPLES_RUNNER,
            files=files,
            stdin=examples.encode(),
            timeout=EXAMPLES_TIMEOUT_S,
            max_output=DEFAULT_MAX_OUTPUT,
            memory_mb=spec.memory_mb,
            workspace_mb=spec.workspace_mb,
        )
        return await ctx.sandboxes.run_python(job)

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        """Reward 1 when every hidden test passes, else 0 (docs/reference/verifiers.md: a
        fraction of tests pays constant and echo answers on many tasks); `tests_passed` is
        the fraction.
        Whatever the agent left instead of a solution is a 0 with a failure class."""

        def zero(failure: str, feedback: str) -> Assessment:
            return Assessment(
                reward=0.0,
                passed=False,
                failure=failure,
                components={"tests_passed": 0.0},
                feedback=feedback,
            )

        sandbox = ctx.sandboxes.episode
        assert sandbox is not None
        try:
            solution = await sandbox.read_file(SOLUTION)
        except FileNotFoundError:
            return zero("missing_file", f"no {SOLUTION} was written")
        except AgentFault as exc:  # a directory, symlink, fifo, sparse giant: the agent's
            return zero(exc.failure, f"{SOLUTION} is not a readable regular file: {exc}")
        if len(solution) > MAX_SOLUTION_BYTES:
            return zero("too_large", f"{SOLUTION} is over {MAX_SOLUTION_BYTES} bytes")
        plan = python_tests.split_tests(task_tests(ctx.task))
        spec = self.sandbox_spec(ctx.task)
        public = CodingPublic.of(ctx.task)
        run = await python_tests.run_python_tests(
            ctx.sandboxes.run_python,
            solution_path=SOLUTION,
            solution=solution,
            plan=plan,
            entry_point=public.entry_point,
            context=public.prompt,
            memory_mb=spec.memory_mb,
            workspace_mb=spec.workspace_mb,
        )
        examples = public_examples(public.prompt, public.entry_point)
        fraction = run.hidden_fraction(python_tests.public_duplicates(plan, examples))
        passed = run.all_passed
        return Assessment(
            reward=1.0 if passed else 0.0,
            passed=passed,
            failure=run.failure,
            components={"tests_passed": fraction},
            feedback=run.summary(),
        )

    def oracle(self, task: Task) -> list[Action]:
        return _write_and_submit(task_solution(task))

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        public = CodingPublic.of(task)
        entry = public.entry_point
        return [
            (
                "docstring-examples",
                _write_and_submit(cheats.examples_only(public.prompt, entry)),
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
