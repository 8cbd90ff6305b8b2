"""`palaestra export atif` / `import atif` against a real `palaestra serve` on loopback: an
echo episode and a harness-mode episode (the bash agent driven by FakeModel, its token ids
and logprobs recorded by the proxy) go out as ATIF-v1.7 and v1.8, each file passes the
`atif` package's validation, and the import gives back every step exactly; an eval run
goes out one file per attempt and comes back as the same run directory; a broken file is
refused naming its step and field, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import atif
import pytest
from conftest import ServerProcess, cli_env

from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import EpisodeState
from tests.envs.terminal.test_harbor import _harbor_python
from tests.harness_peers import SOLVE_2, TRAIN_TASK, finished, harness, llm_calls, started
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.sdk.test_atif import HARBOR_CHECK
from tests.server.test_sealed import make_token

CLI = str(Path(sys.executable).parent / "palaestra")
VERSIONS = ("1.7", "1.8")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=180
    )


@pytest.fixture(scope="module")
def token(door_server: ServerProcess) -> str:
    return make_token(door_server, "train", "harness")


def exported(server: ServerProcess, token: str, episode: str, version: str, tmp: Path) -> Path:
    out = tmp / f"{episode}-{version}.atif.json"
    args = ("export", "atif", episode, "--url", server.url, "--token", token, "-o", str(out))
    result = cli(*args, "--atif-version", version, cwd=tmp)
    assert result.returncode == 0, result.stderr
    return out


def round_trip(server: ServerProcess, token: str, episode: str, tmp: Path) -> list[Any]:
    """Export in both versions, validate with `atif`, import, compare with the server's
    state of the episode record by record; the `atif` documents, by version."""
    with HTTPClient(server.url, token=token) as client:
        state = client.state(episode)
    documents = []
    for version in VERSIONS:
        path = exported(server, token, episode, version, tmp)
        document = atif.Trajectory.model_validate_json(path.read_text())
        assert document.schema_version == f"ATIF-v{version}"
        assert len(document.steps) == len(state.trajectory) > 0
        back_path = tmp / f"{episode}-{version}.state.json"
        result = cli("import", "atif", str(path), "-o", str(back_path), cwd=tmp)
        assert result.returncode == 0, result.stderr
        back = EpisodeState.model_validate_json(back_path.read_text())
        assert back == state
        for ours, theirs in zip(back.trajectory, state.trajectory, strict=True):
            assert ours.model_dump_json() == theirs.model_dump_json()
        documents.append(document)
    return documents


def test_an_echo_episode_round_trips(
    door_server: ServerProcess, token: str, tmp_path: Path
) -> None:
    with HTTPClient(door_server.url, token=token) as client:
        episode = client.reset("palaestra/echo:say-birch").episode_id
        client.step(episode, {"tool": "echo", "arguments": {"text": "birch"}})
        client.step(episode, {"tool": "submit", "arguments": {"answer": "hcrib"}})
        assert client.verify(episode).reward == 1.0
    document = round_trip(door_server, token, episode, tmp_path)[-1]
    first, last = document.steps
    assert first.tool_calls is not None and first.tool_calls[0].function_name == "echo"
    assert first.tool_calls[0].arguments == {"text": "birch"}
    assert last.extra is not None and last.extra["palaestra"]["reward"] == 1.0
    assert document.final_metrics is not None and document.final_metrics.extra is not None
    assert document.final_metrics.extra["reward"] == 1.0


@pytest.mark.slow
def test_a_harness_episode_keeps_its_token_ids_and_logprobs(
    door_server: ServerProcess, token: str, tmp_path: Path
) -> None:
    fake = FakeModel([bash_call(SOLVE_2), submit_call()])
    with fake.serve() as url:
        episode = started(door_server, token, TRAIN_TASK, harness(url))
        state = finished(door_server, token, episode)
    assert state["verdict"]["reward"] == 1.0, state["verdict"]
    calls = llm_calls(state)
    assert len(calls) == 2 and all(c["completion_token_ids"] for c in calls)
    for document in round_trip(door_server, token, episode, tmp_path):
        steps = [s for s in document.steps if s.metrics is not None]
        assert [s.metrics.prompt_token_ids for s in steps if s.metrics] == [
            c["prompt_token_ids"] for c in calls
        ]
        assert [s.metrics.completion_token_ids for s in steps if s.metrics] == [
            c["completion_token_ids"] for c in calls
        ]
        assert [s.metrics.logprobs for s in steps if s.metrics] == [c["logprobs"] for c in calls]
        first = steps[0]
        assert first.tool_calls is not None and first.tool_calls[0].function_name == "bash"
        assert first.tool_calls[0].arguments == {"command": SOLVE_2}
        assert document.steps[-1].source == "system"  # the harness's end
        assert document.agent.extra == {"harness": "bash-agent"}
    files = [str(tmp_path / f"{episode}-{version}.atif.json") for version in VERSIONS]
    checked = subprocess.run([str(_harbor_python()), "-c", HARBOR_CHECK, *files],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-3000:]  # Harbor's own models take them


def test_an_eval_run_round_trips(door_server: ServerProcess, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = cli("eval", "run", "--pack", "palaestra/echo", "--split", "train", "--policy",
                 "oracle", "-k", "2", "--limit", "2", "--url", door_server.url, "--data-dir",
                 str(door_server.data_dir), "--run-dir", str(run), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    for version in VERSIONS:
        out = tmp_path / f"atif-{version}"
        args = ("--run", str(run), "-o", str(out), "--atif-version", version)
        result = cli("export", "atif", *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        files = sorted(out.glob("*.atif.json"))
        assert len(files) == 4
        for path in files:
            document = atif.Trajectory.model_validate_json(path.read_text())
            assert document.schema_version == f"ATIF-v{version}" and document.steps
        back = tmp_path / f"run-{version}"
        result = cli("import", "atif", str(out), "-o", str(back), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert (back / "attempts.jsonl").read_bytes() == (run / "attempts.jsonl").read_bytes()
        manifest = json.loads((run / "manifest.json").read_text())
        assert json.loads((back / "manifest.json").read_text()) == manifest
        report = cli("eval", "report", str(back), cwd=tmp_path)
        assert report.returncode == 0, report.stderr
    # --episodes: each attempt's whole episode from the server; back as episode JSONs.
    out, back = tmp_path / "episodes.atif", tmp_path / "episodes"
    server = ("--url", door_server.url, "--data-dir", str(door_server.data_dir))
    result = cli("export", "atif", "--run", str(run), "--episodes", "-o", str(out), *server,
                 cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = cli("import", "atif", str(out), "-o", str(back), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    attempts = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    with door_server.client() as client:
        for attempt, path in zip(attempts, sorted(back.glob("*.json")), strict=True):
            atif.Trajectory.model_validate_json(
                (out / path.name.replace(".json", ".atif.json")).read_text()
            )
            state = EpisodeState.model_validate_json(path.read_text())
            assert state.episode_id == attempt["episode_id"]
            assert state == client.state(attempt["episode_id"])


def test_a_broken_file_is_refused_naming_step_and_field(
    door_server: ServerProcess, token: str, tmp_path: Path
) -> None:
    with HTTPClient(door_server.url, token=token) as client:
        episode = client.reset("palaestra/echo:say-cobalt").episode_id
        client.step(episode, {"tool": "echo", "arguments": {"text": "x"}})
        client.step(episode, {"tool": "submit", "arguments": {"answer": "tlaboc"}})
    document = json.loads(exported(door_server, token, episode, "1.8", tmp_path).read_text())
    del document["steps"][1]["tool_calls"][0]["function_name"]
    document["steps"][0]["step_id"] = 3
    bad = tmp_path / "bad.atif.json"
    bad.write_text(json.dumps(document))
    out = tmp_path / "never.json"
    result = cli("import", "atif", str(bad), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 2
    assert "steps[1].tool_calls[0].function_name: Field required" in result.stderr
    assert "steps[0].step_id: is 3, expected 1" in result.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [bad.name, f"{episode}-1.8.atif.json"]
    )
    # A run's directory with one bad file: refused, naming it; no run directory made.
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "00000-x.atif.json").write_text(json.dumps(document))
    result = cli("import", "atif", str(folder), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2 and "00000-x.atif.json" in result.stderr
    assert not (tmp_path / "run").exists()
    # Not JSON at all: refused too.
    bad.write_text("{ nope")
    result = cli("import", "atif", str(bad), cwd=tmp_path)
    assert result.returncode == 2 and "not JSON" in result.stderr and result.stdout == ""
