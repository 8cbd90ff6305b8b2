"""The `finance` family: read a PDF annual report with tools, answer with a checked program.

At reset the episode's PDF is generated from the task's private seeds (or typeset from an
imported task's table and text), written to the cache, and parsed with pdfplumber; both
steps are CPU-bound and run in a worker thread, and both are cached: the PDF and its parse
on disk under `<cache>/finance/` (Settings.cache) keyed by the task digest, the parse in memory per
family (an LRU), so later episodes and every tool call are lookups. The tools only ever
read the PDF's parse (or render its pages), never the accounts behind it.

A malformed program, an unknown page or a zero divisor is an observation saying what to
fix; the episode goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from palaestra.envs import (
    Action,
    Assessment,
    CheatSurface,
    EpisodeContext,
    Family,
    FamilySettings,
    Observation,
    PrivateFields,
    PublicFields,
    ServerPaths,
    State,
    StepOutcome,
    Task,
    ToolArgs,
    VerifierInfo,
    tool,
)
from palaestra.envs.finance import cheats as finance_cheats
from palaestra.envs.finance.accounts import variant_seed
from palaestra.envs.finance.document import (
    ParsedDocument,
    numbers_in,
    parse_number,
    parse_pdf,
    render_png,
)  # pdfplumber and pypdfium2 are imported inside parse_pdf / render_png
from palaestra.envs.finance.imported import imported_numbers, render_imported
from palaestra.envs.finance.tasks import build_document
from palaestra.verifiers import finance as vf
from palaestra.verifiers import finance_program as fp
from palaestra.verifiers import finance_text as ft

MAX_TEXT = 20_000
MAX_HITS = 40


class FinanceSettings(FamilySettings):
    """`[families.finance]`: where the reports go and how many stay in memory."""

    cache_dir: Path | None = Field(
        default=None,
        description="generated reports and their parses (default <cache>/finance)",
    )
    memory_documents: int = Field(
        default=32, ge=1, description="parsed reports kept in memory (least recently used go)"
    )


class PageArgs(ToolArgs):
    page: int = Field(description="page number, from 1")


class SearchArgs(ToolArgs):
    text: str = Field(min_length=1, max_length=200, description="text to find (case-insensitive)")


class CalculateArgs(ToolArgs):
    program: str = Field(max_length=fp.MAX_CHARS, description="a FinQA-style program")


class SubmitArgs(vf.Answer, ToolArgs):
    """The answer: {value, unit, scale, program} (verifiers/finance.py)."""


class SubmitTextArgs(ft.TextAnswer, ToolArgs):
    """A text answer: {answers, scale} (verifiers/finance_text.py)."""


@dataclass
class LoadedDocument:
    pdf: bytes
    parsed: ParsedDocument
    numbers: vf.Numbers  # what the verifier binds operands to
    printed: vf.Numbers  # what the parse of the PDF shows (for `calculate`)


def printed_numbers(parsed: ParsedDocument) -> vf.Numbers:
    """Every number token of the parsed pages, and the parsed tables' rows by label."""
    figures: dict[str, float] = {}
    rows: dict[str, list[list[str]]] = {}
    for page in parsed.pages:
        for i, line in enumerate(page.lines):
            for k, token in enumerate(numbers_in(line)):
                value = parse_number(token)
                if value is not None:
                    figures[f"{page.number}.{i}.{k}"] = value
        for t, table in enumerate(page.tables):
            for r, row in enumerate(table):
                keys = []
                for c, cell in enumerate(row[1:], start=1):
                    value = parse_number(cell) if cell else None
                    if value is not None:
                        key = f"{page.number}.t{t}.{r}.{c}"
                        figures[key] = value
                        keys.append(key)
                if row and row[0] and keys:
                    rows.setdefault(vf.normalize_label(row[0]), []).append(keys)
    return vf.Numbers(figures=figures, rows=rows)


@functools.cache
def parse_key() -> str:
    """A digest of the code that renders and parses documents (it keys the disk cache)."""
    from palaestra.envs.finance import document, imported, layout, profiles, report

    h = hashlib.sha256()
    for module in (document, imported, layout, profiles, report):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()[:12]


class FinancePublic(PublicFields):
    """The question, and an imported task's table and text (envs/finance/imported.py)."""

    instruction: str = ""
    question: str = ""
    table: list[list[str]] = Field(default_factory=list)  # rows of cells
    pre_text: list[str] = Field(default_factory=list)  # paragraphs
    post_text: list[str] = Field(default_factory=list)

    @field_validator("table", mode="before")
    @classmethod
    def _rows(cls, value: object) -> object:
        """Rows that are not lists are skipped; a missing table is none."""
        if not value:
            return []
        return [r for r in value if isinstance(r, list)] if isinstance(value, list) else value

    @field_validator("pre_text", "post_text", mode="before")
    @classmethod
    def _paragraphs(cls, value: object) -> object:
        """One paragraph may be given as a string; a missing text is none."""
        if not value:
            return []
        return value if isinstance(value, list) else [value]

    def imported(self) -> tuple[list[list[str]], list[str], list[str]]:
        return self.table, self.pre_text, self.post_text


class DocumentSpec(PrivateFields):
    """How the report is made: generated from seeds, or typeset from an imported task."""

    kind: str = "generated"
    structure_seed: int = 0
    value_seed: int = 0
    level: int = 0


class Prior(PrivateFields):
    value: float
    program: str


class FinancePrivate(PrivateFields):
    document: DocumentSpec
    gold: dict[str, Any]
    prior: Prior | None = None

    def seeds(self) -> tuple[int, int, int]:
        doc = self.document
        return doc.structure_seed, doc.value_seed, doc.level


def _task_hex(task: Task) -> str:
    return task.digest.removeprefix("sha256:")[:40]


class FinanceState(State):
    doc: LoadedDocument | None = None  # the episode's report (loaded at reset)
    answer: vf.Answer | ft.TextAnswer | None = None  # what `submit` or `submit_text` gave

    def document(self) -> LoadedDocument:
        assert self.doc is not None  # reset loads it
        return self.doc


Ctx = EpisodeContext[FinanceState]


class FinanceFamily(Family[FinanceState]):
    name = "finance"
    description = (
        "Answer a question about a PDF annual report with a number and the FinQA-style program "
        "that computes it from the report's figures."
    )
    version = "1.0.0"
    public_fields = FinancePublic
    private_fields = FinancePrivate

    settings_model = FinanceSettings
    settings: FinanceSettings

    def __init__(
        self, settings: FamilySettings | None = None, server: ServerPaths | None = None
    ) -> None:
        super().__init__(settings, server)
        self._docs: OrderedDict[str, LoadedDocument] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    # -- documents -------------------------------------------------------------------------
    def _dir(self) -> Path:
        return self.settings.cache_dir or self.server.cache_for("finance")

    def _numbers(self, task: Task) -> vf.Numbers:
        private = FinancePrivate.of(task)
        if private.document.kind == "imported":
            return imported_numbers(*FinancePublic.of(task).imported())
        return build_document(*private.seeds()).numbers

    def _pdf(self, task: Task) -> bytes:
        from palaestra.envs.finance.report import render  # reportlab: on first use

        private = FinancePrivate.of(task)
        if private.document.kind == "imported":
            return render_imported(*FinancePublic.of(task).imported())
        built = build_document(*private.seeds(), text=True)
        return render(built.layout, built.accounts.structure.style)

    def load_sync(self, task: Task) -> LoadedDocument:
        """PDF and parse of a task's document, from disk if cached (blocking: use a thread)."""
        base = self._dir() / f"{_task_hex(task)}-{parse_key()}"
        pdf_path = base.with_suffix(".pdf")
        parse_path = base.with_name(f"{base.name}.parse.json")
        pdf: bytes | None = None
        parsed: ParsedDocument | None = None
        try:
            pdf = pdf_path.read_bytes()
            parsed = ParsedDocument.from_json(json.loads(parse_path.read_text("utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if pdf is None or parsed is None:
            pdf = self._pdf(task)
            parsed = parse_pdf(pdf)
            try:
                base.parent.mkdir(parents=True, exist_ok=True)
                for path, data in (
                    (pdf_path, pdf),
                    (parse_path, json.dumps(parsed.to_json()).encode()),
                ):
                    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)
            except OSError:
                pass  # a read-only cache costs a re-parse next time, nothing more
        return LoadedDocument(pdf, parsed, self._numbers(task), printed_numbers(parsed))

    async def load(self, task: Task) -> LoadedDocument:
        key = task.digest
        hit = self._docs.get(key)
        if hit is not None:
            self._docs.move_to_end(key)
            return hit
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._docs.get(key)
            if hit is None:
                hit = await asyncio.to_thread(self.load_sync, task)
                self._docs[key] = hit
                while len(self._docs) > self.settings.memory_documents:
                    old, _ = self._docs.popitem(last=False)
                    self._locks.pop(old, None)
        return hit

    # -- episode -----------------------------------------------------------------------------
    async def reset(self, ctx: Ctx) -> Observation:
        doc = ctx.state.doc = await self.load(ctx.task)
        pages = len(doc.parsed.pages)
        text = f"{FinancePublic.of(ctx.task).instruction}\n\nThe report has {pages} pages."
        return Observation(text=text, data={"pages": pages})

    def _page(self, doc: LoadedDocument, page: int) -> Any:
        pages = len(doc.parsed.pages)
        if not 1 <= page <= pages:
            return None, Observation(
                text=f"page {page} does not exist; the report has pages 1 to {pages}",
                data={"error": "unknown_page", "pages": pages},
            )
        return doc.parsed.pages[page - 1], None

    # -- tools -------------------------------------------------------------------------------
    @tool("List the report's pages with their first line.")
    async def list_pages(self, ctx: Ctx) -> StepOutcome:
        doc = ctx.state.document()
        lines = []
        for p in doc.parsed.pages:
            first = p.lines[0] if p.lines else "(blank)"
            extra = ", two columns" if p.two_column else ""
            if p.tables:
                extra += f", {len(p.tables)} table{'s' if len(p.tables) > 1 else ''}"
            lines.append(f"page {p.number}: {first[:80]}{extra}")
        return StepOutcome(
            Observation(text="\n".join(lines), data={"pages": len(doc.parsed.pages)})
        )

    @tool("The text of one page in reading order (two columns: left first).")
    async def read_page(self, ctx: Ctx, args: PageArgs) -> StepOutcome:
        page, error = self._page(ctx.state.document(), args.page)
        if error is not None:
            return StepOutcome(error)
        return StepOutcome(
            Observation(
                text=page.text[:MAX_TEXT],
                data={"page": page.number, "two_column": page.two_column},
            )
        )

    @tool("The tables of one page, as rows of cells.")
    async def extract_tables(self, ctx: Ctx, args: PageArgs) -> StepOutcome:
        page, error = self._page(ctx.state.document(), args.page)
        if error is not None:
            return StepOutcome(error)
        if not page.tables:
            return StepOutcome(
                Observation(text=f"no table on page {page.number}", data={"tables": []})
            )
        parts = []
        for i, table in enumerate(page.tables, start=1):
            body = "\n".join(" | ".join(row) for row in table)
            parts.append(f"table {i}:\n{body}")
        return StepOutcome(
            Observation(text="\n\n".join(parts)[:MAX_TEXT], data={"tables": page.tables})
        )

    @tool("Find the lines that contain a text, with their page.")
    async def search(self, ctx: Ctx, args: SearchArgs) -> StepOutcome:
        needle = args.text.lower()
        hits = [
            (p.number, line)
            for p in ctx.state.document().parsed.pages
            for line in p.lines
            if needle in line.lower()
        ]
        shown = hits[:MAX_HITS]
        text = "\n".join(f"page {n}: {line}" for n, line in shown) or "no match"
        if len(hits) > len(shown):
            text += f"\n… {len(hits) - len(shown)} more"
        return StepOutcome(Observation(text=text, data={"matches": len(hits)}))

    @tool("One page as a PNG image.")
    async def page_image(self, ctx: Ctx, args: PageArgs) -> StepOutcome:
        doc = ctx.state.document()
        page, error = self._page(doc, args.page)
        if error is not None:
            return StepOutcome(error)
        png = await asyncio.to_thread(render_png, doc.pdf, page.number)
        return StepOutcome(Observation(text=f"page {page.number}", images=[png]))

    @tool("Run a FinQA-style program and show every step's value.")
    async def calculate(self, ctx: Ctx, args: CalculateArgs) -> StepOutcome:
        return StepOutcome(self._calculate(args.program, ctx.state.document().printed))

    @tool("End the episode with {value, unit, scale, program}.")
    async def submit(self, ctx: Ctx, args: SubmitArgs) -> StepOutcome:
        ctx.state.answer = args
        return StepOutcome(Observation(text="submitted"), done=True)

    @tool(
        "End the episode with a text answer {answers, scale}: a span or list of the "
        "document's text (imported TAT-QA questions that ask for one)."
    )
    async def submit_text(self, ctx: Ctx, args: SubmitTextArgs) -> StepOutcome:
        ctx.state.answer = args
        return StepOutcome(Observation(text="submitted"), done=True)

    def _calculate(self, program: str, numbers: vf.Numbers) -> Observation:
        try:
            parsed = fp.parse(program)
            values = fp.run(
                parsed,
                None,
                lambda label: [abs(numbers.figures[k]) for k in numbers.row_keys(label)],
            )
        except fp.ProgramError as exc:
            return Observation(text=f"program error: {exc}", data={"error": str(exc)})
        lines = [f"#{i} = {v:.10g}" for i, v in enumerate(values)]
        missing = [
            lit.text
            for lit in parsed.literals
            if numbers.key_of(lit.magnitude) is None
            and round(lit.magnitude, 6) not in numbers.labels
        ]
        if missing:
            lines.append("note: not printed in the report: " + ", ".join(missing[:10]))
        return Observation(text="\n".join(lines), data={"result": values[-1], "steps": values})

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="finance-answer-program", version=vf.VERSION)

    async def verify(self, ctx: Ctx) -> Assessment:
        answer = ctx.state.answer
        if answer is None:
            return Assessment(
                reward=0.0,
                passed=False,
                failure="no_answer",
                feedback="no answer submitted",
                components={"value": 0.0, "program": 0.0, "grounded": 0.0},
            )
        graded = await self._grade(ctx, answer)
        return Assessment(
            reward=graded.reward,
            passed=graded.passed,
            components=graded.components,
            feedback=graded.feedback,
        )

    async def _grade(self, ctx: Ctx, answer: vf.Answer | ft.TextAnswer) -> vf.Grade:
        gold_json = FinancePrivate.of(ctx.task).gold
        if gold_json.get("kind") == "text":
            if isinstance(answer, ft.TextAnswer):
                return ft.grade(answer, gold_json)
            return _wrong_tool("this question asks for text: answer with submit_text")
        if isinstance(answer, ft.TextAnswer):
            return _wrong_tool("this question asks for a number and its program: use submit")
        doc = ctx.state.document()
        gold = vf.Gold.from_json(gold_json)
        if FinancePrivate.of(ctx.task).document.kind == "imported":
            # An imported question's instruction never states the unit (packs imported
            # before verifier 2.1 do not say so in their gold).
            gold = dataclasses.replace(gold, unit_stated=False)
        variant = await asyncio.to_thread(variant_of, ctx.task, gold)
        question = FinancePublic.of(ctx.task).question
        return vf.grade(answer, gold, doc.numbers, variant, question)

    # -- reference attempts ------------------------------------------------------------------
    def oracle(self, task: Task) -> list[Action]:
        gold_json = FinancePrivate.of(task).gold
        if gold_json.get("kind") == "text":
            args = {"answers": gold_json["answers"], "scale": gold_json["scale"]}
            return [Action(tool="submit_text", arguments=args)]
        gold = vf.Gold.from_json(gold_json)
        return [_submit(gold.asked_value, gold.unit, gold.scale, gold.program)]

    def null(self, task: Task) -> list[Action]:
        """An empty answer (a numeric 0 would be the right value of a yes/no "no")."""
        return [Action(tool="submit_text", arguments={"answers": [""]})]

    def cheat_surface(self, task: Task) -> CheatSurface:
        """Answers go to `submit_text` for a text question, else to `submit` as a bare value
        in the gold's unit and scale (so only the value is wrong)."""
        gold_json = FinancePrivate.of(task).gold
        if gold_json.get("kind") == "text":
            answers = [str(a) for a in gold_json["answers"]]
            return CheatSurface(
                answer=functools.partial(_text_answer, gold_json["scale"]),
                expected=answers[0] if len(answers) == 1 else None,
            )
        gold = vf.Gold.from_json(gold_json)
        return CheatSurface(
            answer=functools.partial(_value_answer, gold.unit, gold.scale),
            expected=f"{gold.asked_value:g}",
        )

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        gold_json = FinancePrivate.of(task).gold
        if gold_json.get("kind") == "text":
            public = FinancePublic.of(task)
            return [
                (name, [Action(tool="submit_text", arguments=args)])
                for name, args in finance_cheats.text_cheats(gold_json, *public.imported())
            ]
        gold = vf.Gold.from_json(gold_json)
        numbers = self._numbers(task)
        programs = finance_cheats.program_cheats(gold, numbers)
        programs += finance_cheats.yes_no_cheats(gold, numbers)
        answers = cheat_answers(task)
        if numbers.key_of(abs(gold.asked_value)) is not None:  # the answer is printed as is
            answers = [(name, a) for name, a in answers if name != "invented-operands"]
        return answers + [
            (name, [Action(tool="submit", arguments=args)]) for name, args in programs
        ]


def _text_answer(scale: str, text: str) -> Action:
    return Action(tool="submit_text", arguments={"answers": [text], "scale": scale})


def _value_answer(unit: str, scale: str, text: str) -> Action:
    """A bare value (no program), as text: pydantic reads "nan", "1e999", "+5"; other forms
    are refused as malformed (422)."""
    return Action(
        tool="submit", arguments={"value": text, "unit": unit, "scale": scale, "program": ""}
    )


def _wrong_tool(feedback: str) -> vf.Grade:
    return vf.Grade(reward=0.0, passed=False, components={"value": 0.0}, feedback=feedback)


def _submit(value: float, unit: str, scale: str, program: str) -> Action:
    return Action(
        tool="submit", arguments={"value": value, "unit": unit, "scale": scale, "program": program}
    )


def variant_of(task: Task, gold: vf.Gold) -> tuple[vf.Numbers, float] | None:
    """The regenerated document's numbers and its gold answer (None: not regenerable).

    The gold program is re-run through the same cell binding as an agent's program, so both
    read a cell whose sign flips in the regenerated document the same way."""
    private = FinancePrivate.of(task)
    if private.document.kind != "generated":
        return None
    seeds = private.seeds()
    doc = build_document(*seeds).numbers
    built = build_document(seeds[0], variant_seed(seeds[1]), seeds[2])
    try:
        expected = vf.rerun(gold.program, doc, built.numbers) * gold.factor
    except (fp.ProgramError, KeyError):
        return None
    return built.numbers, expected


_SCALE_UP = {
    "units": "thousands",
    "thousands": "millions",
    "millions": "thousands",
    "billions": "millions",
}


def cheat_answers(task: Task) -> list[tuple[str, list[Action]]]:
    """The known ways to game the verifier; each must score 0."""
    private = FinancePrivate.of(task)
    gold = vf.Gold.from_json(private.gold)
    asked = gold.asked_value
    question = FinancePublic.of(task).question
    cheats = [
        (
            "invented-operands",
            [_submit(asked, gold.unit, gold.scale, f"add({asked:.10g}, const_0)")],
        ),
    ]
    if asked == 0:  # 0 in any unit or scale is the right answer, not a cheat
        return cheats
    cheats.append(("wrong-scale", [_submit(asked, gold.unit, _SCALE_UP[gold.scale], gold.program)]))
    numbers = re.findall(r"\d+(?:\.\d+)?", question)
    if numbers:
        copied = float(numbers[0])
        cheats.append(
            ("copy-question-number", [_submit(copied, gold.unit, gold.scale, numbers[0])])
        )
    if gold.unit == "percent":
        cheats.append(
            ("fraction-as-percent", [_submit(gold.value, "percent", "units", gold.program)])
        )
    elif gold.unit == "ratio":
        cheats.append(
            ("percent-as-ratio", [_submit(gold.value * 100, "ratio", "units", gold.program)])
        )
    # The asked digits under a unit that reads them as another number: where the unit is
    # not stated any unit but percent is the number itself, and that must not widen the target.
    relabel = "currency" if gold.unit == "percent" else "percent"
    cheats.append(("unit-relabel", [_submit(asked, relabel, gold.scale, gold.program)]))
    prior = private.prior
    if prior is not None:
        cheats.append(("prior-year", [_submit(prior.value, gold.unit, gold.scale, prior.program)]))
    return cheats
