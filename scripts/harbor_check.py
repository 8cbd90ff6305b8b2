"""Harbor's own view of a folder of Harbor tasks (run in scripts/harbor-venv.sh's venv).

For each task folder: Harbor's `Task` loader (with the schema 1.4 fields: network policy,
artifacts, the verifier's environment), its linter's validity rules (config, unknown fields,
files) and its packager's content digest; and the folder's dataset.toml (if it has one;
else "dataset" is null) as Harbor's `DatasetManifest`. Prints one JSON object:
{"tasks": {name: {...}}, "dataset": {...}}.
Usage: python harbor_check.py FOLDER
"""

import json
import sys
import warnings
from pathlib import Path

from harbor.lint.models import LintRule
from harbor.lint.task import lint_task
from harbor.models.dataset.manifest import DatasetManifest
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import (
    resolve_task_verifier_mode,
    resolve_verifier_environment_definition,
)
from harbor.publisher.packager import Packager

RULES = {LintRule.INVALID_TASK_CONFIG, LintRule.UNKNOWN_CONFIG_FIELD, LintRule.INVALID_TASK_FILES}


def check(folder: Path) -> dict[str, object]:
    result: dict[str, object] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            task = Task(folder)
        config = task.config
        result.update(
            loaded=True,
            name=task.name,
            agent_timeout_sec=config.agent.timeout_sec,
            verifier_timeout_sec=config.verifier.timeout_sec,
            build_timeout_sec=config.environment.build_timeout_sec,
            cpus=config.environment.cpus,
            memory_mb=config.environment.memory_mb,
            storage_mb=config.environment.storage_mb,
            schema_version=config.schema_version,
            network_mode=config.environment.network_mode.value,
            allowed_hosts=config.environment.allowed_hosts,
            agent_network_mode=config.agent.network_mode and config.agent.network_mode.value,
            agent_allowed_hosts=config.agent.allowed_hosts,
            artifacts=[a if isinstance(a, str) else a.source for a in config.artifacts],
            verifier_mode=resolve_task_verifier_mode(config).value,
            verifier_bundled_tests=bool(
                (found := resolve_verifier_environment_definition(config, task.paths))
                and found.bundled_tests
            ),
            metadata=config.metadata,
            instruction=task.instruction,
        )
    except Exception as exc:  # report what Harbor says, whatever it raises
        result.update(loaded=False, error=f"{type(exc).__name__}: {exc}")
    result["lint"] = [f"{f.rule}: {f.message}" for f in lint_task(folder, selected_rules=RULES)]
    result["digest"] = "sha256:" + Packager.compute_content_hash(folder)[0]
    return result


def main() -> None:
    root = Path(sys.argv[1])
    tasks = {p.name: check(p) for p in sorted(root.iterdir()) if (p / "task.toml").is_file()}
    dataset = None
    if (root / "dataset.toml").is_file():  # an export pins its folders; a source may not
        manifest = DatasetManifest.from_toml_file(root / "dataset.toml")
        dataset = {
            "name": manifest.dataset.name,
            "tasks": {t.short_name: t.digest for t in manifest.tasks},
        }
    print(json.dumps({"tasks": tasks, "dataset": dataset}, default=str))


if __name__ == "__main__":
    main()
