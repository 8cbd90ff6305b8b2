"""What `palaestra pack check` found: per task rewards, problems, cheats over the limit.

The report's shapes (the per-task table, the summary line, `--json`) are documented in
docs/writing-a-pack.md ("pack check") and docs/cheats.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIN_DOMAIN_TASKS = 10  # tasks of a domain a domain-judged play needs before it is judged


@dataclass
class Problem:
    where: str  # a task id, or a file of the pack
    check: str  # load, lock, determinism, oracle, rerun, null, cheat:<name>
    message: str  # what is wrong and what to fix


@dataclass
class OverLimit:
    """A cheat that scored more than the pack's `cheat_max_reward` on one task."""

    cheat: str
    kind: str | None  # the generic library class that played it; None: the family's own
    task: str
    reward: float
    limit: float
    feedback: str

    def to_json(self) -> dict[str, Any]:
        return {
            "cheat": self.cheat,
            "class": self.kind,
            "generic": self.kind is not None,
            "task": self.task,
            "reward": self.reward,
            "limit": self.limit,
            "feedback": self.feedback,
        }


@dataclass
class CheckReport:
    root: Path
    pack: str | None = None  # org/name@version
    digest: str | None = None
    tasks: int = 0
    checked: int = 0
    episodes: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    allowed: dict[str, list[str]] = field(default_factory=dict)  # cheat -> tasks it scored on

    allow_reasons: dict[str, str] = field(default_factory=dict)
    results: dict[str, TaskResult] = field(default_factory=dict)  # task id -> its rewards
    cheat_max: float = 0.1  # the pack's [checks] cheat_max_reward
    over_limit: list[OverLimit] = field(default_factory=list)  # every cheat over the limit
    # (domain, play) -> (class, limit, rewards): plays judged by their mean over a domain
    domain_plays: dict[tuple[str, str], tuple[str, float, list[float]]] = field(
        default_factory=dict
    )
    generic: dict[str, str] = field(default_factory=dict)  # library cheat played -> its class

    def add_domain_play(
        self, domain: str, name: str, kind: str, limit: float, reward: float
    ) -> None:
        self.domain_plays.setdefault((domain, name), (kind, limit, []))[2].append(reward)

    def judge_domains(self, allowed: set[str]) -> None:
        """A domain play whose mean over at least `MIN_DOMAIN_TASKS` tasks exceeds its limit
        is a problem (where: `domain:<name>`) and over the limit; over fewer, a note."""
        for (domain, name), (kind, limit, rewards) in sorted(self.domain_plays.items()):
            mean = sum(rewards) / len(rewards)
            if mean <= limit + 1e-9:
                continue
            where = f"domain:{domain}"
            if len(rewards) < MIN_DOMAIN_TASKS:
                self.notes.append(
                    f"{name} on {where}: mean {mean:.3f} > {limit:.3f} over {len(rewards)} "
                    f"task(s), too few to judge (check at least {MIN_DOMAIN_TASKS})"
                )
                continue
            if name in allowed or kind in allowed:
                self.allowed.setdefault(name, []).append(where)
                continue
            feedback = f"mean over {len(rewards)} tasks of the domain"
            self.over_limit.append(OverLimit(name, kind, where, mean, limit, feedback))
            self.problems.append(
                Problem(
                    where,
                    f"cheat:{name}",
                    f"the generic cheat {name!r} (library class {kind}) earns {mean:.3f} on "
                    f"average over {len(rewards)} tasks of the domain > {limit:.3f} (1/k + "
                    "0.05 for k labels): the domain's answers are skewed; balance its labels",
                )
            )

    @property
    def ok(self) -> bool:
        return not self.problems

    def cheat_summary(self) -> dict[str, dict[str, float | int]]:
        """Per cheat: how many tasks it ran on, its max and mean reward (None runs skipped)."""
        by_cheat: dict[str, list[float]] = {}
        for result in self.results.values():
            for name, reward in result.cheats.items():
                if reward is not None:
                    by_cheat.setdefault(name, []).append(reward)
        return {
            name: {"tasks": len(xs), "max": max(xs), "mean": sum(xs) / len(xs)}
            for name, xs in sorted(by_cheat.items())
        }

    def failed_checks(self, task_id: str) -> list[str]:
        """The checks that failed on one task (oracle, rerun, null, cheat:<name>, …)."""
        return sorted({p.check for p in self.problems if p.where == task_id})

    def summary(self) -> dict[str, int]:
        """Counts over the checked tasks: oracle at its expected reward, null 0, every cheat
        at most the limit (or allowed), tasks with a void episode."""
        rows = list(self.results.values())
        return {
            "tasks": len(rows),
            "oracle_pass": sum(
                r.oracle is not None and r.oracle >= r.expected - 1e-9 for r in rows
            ),
            "null_zero": sum(r.null == 0 for r in rows),
            "cheats_ok": sum(r.cheats_ok(self.cheat_max, set(self.allow_reasons)) for r in rows),
            "void": sum(bool(r.void) for r in rows),
        }

    def summary_line(self) -> str:
        s = self.summary()
        n = s["tasks"]
        return (
            f"oracle {s['oracle_pass']}/{n} pass, null {s['null_zero']}/{n} zero, "
            f"cheats {s['cheats_ok']}/{n} ≤ {self.cheat_max:g}, void {s['void']}"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as `pack check --json` writes it."""
        summary = self.cheat_summary()
        worst = max(summary.items(), key=lambda kv: (kv[1]["max"], kv[1]["mean"]), default=None)
        return {
            "pack": self.pack,
            "digest": self.digest,
            "ok": self.ok,
            "tasks": self.tasks,
            "checked": self.checked,
            "episodes": self.episodes,
            "summary": {**self.summary(), "line": self.summary_line()},
            "results": [
                {**self.results[k].to_json(), **self._verdict(k)} for k in sorted(self.results)
            ],
            "cheats": summary,
            "worst_cheat": {"name": worst[0], **worst[1]} if worst else None,
            "cheat_max_reward": self.cheat_max,
            "over_limit": [o.to_json() for o in sorted(self.over_limit, key=_over_key)],
            "generic": dict(sorted(self.generic.items())),
            "problems": [
                {"where": p.where, "check": p.check, "message": p.message} for p in self.problems
            ],
            "allowed": self.allowed,
            "notes": self.notes,
        }

    def _verdict(self, task_id: str) -> dict[str, Any]:
        """A task's verdict class: pass, or the checks it failed (void episodes say why)."""
        failed = self.failed_checks(task_id)
        return {"verdict": "fail" if failed else "pass", "failed": failed}


@dataclass
class TaskResult:
    """What each episode of one task scored (None: the episode gave no ok verdict)."""

    task: str
    split: str
    oracle: float | None = None
    rerun: float | None = None
    null: float | None = None
    cheats: dict[str, float | None] = field(default_factory=dict)
    void: dict[str, str] = field(default_factory=dict)  # void episode's label -> its reason
    refused: dict[str, str] = field(default_factory=dict)  # generic cheat the tools refused
    domain_cheats: dict[str, float | None] = field(default_factory=dict)  # judged by domain
    expected: float = 1.0  # the oracle's expected reward

    def cheats_ok(self, limit: float, allowed: set[str]) -> bool:
        """Every cheat ran to a verdict at most `limit` (or is allowed by the pack)."""
        return all(
            n in allowed or (r is not None and r <= limit + 1e-9) for n, r in self.cheats.items()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "split": self.split,
            "oracle": self.oracle,
            "rerun": self.rerun,
            "null": self.null,
            "cheats": self.cheats,
            "void": self.void,
            "refused": self.refused,
            "domain_cheats": self.domain_cheats,
            "expected": self.expected,
        }


def _over_key(o: OverLimit) -> tuple[float, str, str]:
    return (-o.reward, o.cheat, o.task)
