"""The cad family end to end: real bwrap sandboxes, the embedded manager, both toolchains.

Covers: run_script's mesh summary, render's PNG, bad scripts (crash, endless loop, memory
exhaustion, no mesh) as observations that leave the episode going, a verifier fault as a
void episode, a Blender-built part verified, and `palaestra pack check` on the cad pack.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_settings
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.cad import runtime
from palaestra.envs.cad.cheats import oracle_script
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS, Settings
from palaestra.server.inprocess import InProcessClient
from palaestra.server.packs.loader import load_pack

_OK, _WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")


@pytest.fixture(scope="module")
def cad_tasks() -> dict[str, Task]:
    return load_pack(REPO_PACKS / "cad", ["cad"]).tasks


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessClient]:
    data = tmp_path_factory.mktemp("cad-data")
    with InProcessClient(make_settings(data_dir=data)) as c:
        yield c


def _pick(tasks: dict[str, Task], domain: str, level: int, split: str = "train") -> Task:
    return next(
        t
        for t in sorted(tasks.values(), key=lambda t: t.id)
        if t.domain == f"cad/{domain}" and t.private["level"] == level and t.split == split
    )


def _write(path: str, content: str) -> dict[str, object]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


def _run(path: str = "part.py", **extra: object) -> dict[str, object]:
    return {"tool": "run_script", "arguments": {"path": path, **extra}}


def test_sandbox_sees_the_toolchain_but_not_the_server(
    client: InProcessClient, cad_tasks: dict[str, Task]
) -> None:
    task = _pick(cad_tasks, "hexnut", 1)
    eid = client.reset(task.ref).episode_id
    probe = (
        "import os, sys, numpy, trimesh, manifold3d\n"
        "print('paths', [p for p in sys.path if 'palaestra' in p])\n"
        f"print('repo', os.path.exists({str(REPO_PACKS)!r}))\n"
        "try:\n    import palaestra\n    print('server importable')\n"
        "except ImportError:\n    print('server hidden')\n"
        "open('/opt/palaestra/trimesh/x', 'w')\n"
    )
    client.step(eid, _write("probe.py", probe))
    obs = client.step(eid, _run("probe.py")).observation
    assert "paths ['/opt/palaestra/trimesh']" in obs.text
    assert "repo False" in obs.text and "server hidden" in obs.text
    assert "Read-only file system" in obs.text  # the bound toolchain cannot be changed
    client.close(eid)


def test_oracle_run_summary_render_and_verdict(
    client: InProcessClient, cad_tasks: dict[str, Task]
) -> None:
    from PIL import Image

    task = _pick(cad_tasks, "mug", 1)
    eid = client.reset(task.ref).episode_id
    client.step(eid, _write("part.py", oracle_script(task)))
    res = client.step(eid, _run())
    mesh = res.observation.data["mesh"]
    assert res.observation.data["exit_code"] == 0 and not res.terminated
    assert mesh["watertight"] and mesh["bodies"] == 1 and mesh["genus"] == 1  # the handle
    assert "genus 1" in res.observation.text
    shot = client.step(eid, {"tool": "render", "arguments": {}}).observation
    assert len(shot.images) == 1
    img = Image.open(io.BytesIO(base64.b64decode(shot.images[0])))
    assert img.size == (512, 512)
    assert len(img.convert("L").getcolors(65536) or []) > 20  # shaded geometry, not a blank sheet
    final = client.step(eid, {"tool": "submit", "arguments": {}})
    assert final.terminated and final.reward == 1.0
    verdict = client.verify(eid)
    assert verdict.status == "ok" and verdict.passed
    assert verdict.components["iou"] == 1.0 and verdict.components["wall"] == 1.0


def test_bad_scripts_are_observations_and_the_episode_goes_on(
    client: InProcessClient, cad_tasks: dict[str, Task]
) -> None:
    task = _pick(cad_tasks, "plate", 1)
    eid = client.reset(task.ref).episode_id
    cases = {
        "crash.py": ("raise SystemExit('boom: no geometry')\n", {}, "exit code 1"),
        "loop.py": ("while True:\n    pass\n", {"timeout": 2}, "timed out"),
        "hog.py": ("x = b'1' * (3 * 1024**3)\n", {}, ""),
        "nomesh.py": ("print('built nothing')\n", {}, "no out.stl was written"),
    }
    for name, (code, extra, expect) in cases.items():
        client.step(eid, _write(name, code))
        res = client.step(eid, _run(name, **extra))
        assert not res.terminated and not res.truncated, name
        assert "no out.stl was written" in res.observation.text, name
        assert expect in res.observation.text, (name, res.observation.text)
        if name == "hog.py":
            data = res.observation.data
            assert data["oom_killed"] or "MemoryError" in res.observation.text
    # Unknown toolchain arguments are a 422, the episode still goes on.
    with pytest.raises(Exception, match="toolchain"):
        client.step(eid, _run("crash.py", toolchain="maya"))
    # …and the same episode can still be solved.
    client.step(eid, _write("part.py", oracle_script(task)))
    assert client.step(eid, _run()).observation.data["mesh"]["watertight"]
    assert client.step(eid, {"tool": "submit", "arguments": {}}).reward == 1.0


def test_a_stale_mesh_is_not_graded(client: InProcessClient, cad_tasks: dict[str, Task]) -> None:
    """Verification runs the script again in a fresh sandbox: an out.stl left behind by an
    earlier script does not count when the last script writes none."""
    task = _pick(cad_tasks, "tube", 1)
    eid = client.reset(task.ref).episode_id
    client.step(eid, _write("part.py", oracle_script(task)))
    client.step(eid, _run())
    client.step(eid, _write("noop.py", "print('PASS')\n"))
    client.step(eid, {"tool": "run_script", "arguments": {"path": "noop.py"}})
    final = client.step(eid, {"tool": "submit", "arguments": {}})
    assert final.reward == 0.0
    assert client.verify(eid).components == {"gate": 0.0}


def test_parametric_task_reruns_with_hidden_values(
    client: InProcessClient, cad_tasks: dict[str, Task]
) -> None:
    task = _pick(cad_tasks, "shaft", 3)
    assert task.public["parametric"]
    eid = client.reset(task.ref).episode_id
    # A hard-coded script: the task's own numbers, ignoring params.json.
    hard = oracle_script(task).replace("if _os.path.exists(", "if False and _os.path.exists(")
    client.step(eid, _write("part.py", hard))
    assert client.step(eid, _run()).observation.data["mesh"]["watertight"]
    final = client.step(eid, {"tool": "submit", "arguments": {}})
    verdict = client.verify(eid)
    assert verdict.components["iou"] == 1.0  # right for the visible numbers…
    assert verdict.components["hidden_rerun"] <= 0.1  # …caught by the hidden re-run
    assert final.reward is not None and final.reward <= 0.1


def test_verifier_fault_voids_the_episode(tmp_path: Path) -> None:
    pack = tmp_path / "packs" / "broken"
    pack.mkdir(parents=True)
    (pack / "pack.toml").write_text(
        'name = "test/broken-cad"\nversion = "0.1.0"\nfamilies = ["cad"]\n'
        "[splits.train]\nsealed = false\n"
    )
    task = {
        "id": "no-such-domain",
        "family": "cad",
        "split": "train",
        "public": {"instruction": "a box", "params": {}, "parametric": False},
        "private": {"domain": "no-such-domain", "params": {}, "level": 1},
    }
    (pack / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    box = (
        "import manifold3d, trimesh\n"
        "m = manifold3d.Manifold.cube((10, 10, 10)).to_mesh()\n"
        "trimesh.Trimesh(m.vert_properties[:, :3], m.tri_verts).export('out.stl')\n"
    )
    with InProcessClient(Settings(data_dir=tmp_path / "data", packs_dirs=[pack.parent])) as c:
        eid = c.reset("test/broken-cad:no-such-domain").episode_id
        c.step(eid, _write("part.py", box))
        assert c.step(eid, _run()).observation.data["mesh"]["watertight"]
        final = c.step(eid, {"tool": "submit", "arguments": {}})
        verdict = c.verify(eid)
    assert verdict.status == "void", verdict
    assert final.info.get("status") == "void"


TRIMESH_PLATE = """
import json
import trimesh

p = json.loads(PARAMS)
plate = trimesh.creation.box((p["length"], p["width"], p["thickness"]))
plate.apply_translation((0, 0, p["thickness"] / 2))
cutters = []
for i in range(p["cols"]):
    for j in range(p["rows"]):
        c = trimesh.creation.cylinder(p["hole_d"] / 2, p["thickness"] + 2, sections=48)
        c.apply_translation(
            ((i - (p["cols"] - 1) / 2) * p["pitch_x"], (j - (p["rows"] - 1) / 2) * p["pitch_y"],
             p["thickness"] / 2)
        )
        cutters.append(c)
part = trimesh.boolean.difference([plate, *cutters], engine="manifold")
part.export("out.stl")
"""


def test_trimesh_toolchain_builds_a_verified_part(
    client: InProcessClient, cad_tasks: dict[str, Task]
) -> None:
    """An agent-style script with trimesh's own API (booleans through manifold3d)."""
    task = _pick(cad_tasks, "plate", 2)
    script = "PARAMS = " + repr(json.dumps(task.private["params"])) + "\n" + TRIMESH_PLATE
    script = script.replace(
        'plate = trimesh.creation.box((p["length"], p["width"], p["thickness"]))',
        'plate = trimesh.creation.box((p["length"], p["width"], p["thickness"]))'
        if not task.private["params"]["corner_radius"]
        else ROUNDED,
    )
    eid = client.reset(task.ref).episode_id
    client.step(eid, _write("part.py", script))
    res = client.step(eid, _run())
    assert res.observation.data["exit_code"] == 0, res.observation.text
    final = client.step(eid, {"tool": "submit", "arguments": {}})
    verdict = client.verify(eid)
    assert verdict.components["topology"] == 1.0 and verdict.components["features"] == 1.0
    assert final.reward is not None and final.reward >= 0.95, verdict.feedback


# Level-2 plates have rounded vertical corner edges: the hull of four corner cylinders.
ROUNDED = (
    "r = p['corner_radius']\n"
    "posts = [trimesh.creation.cylinder(r, p['thickness'], sections=48).apply_translation("
    "(sx * (p['length'] / 2 - r), sy * (p['width'] / 2 - r), 0)) "
    "for sx in (-1, 1) for sy in (-1, 1)]\n"
    "plate = trimesh.util.concatenate(posts).convex_hull"
)


BLENDER_PLATE = """
import json
import bpy

p = json.loads(PARAMS)
bpy.ops.wm.read_factory_settings(use_empty=True)
bpy.ops.mesh.primitive_cube_add(size=1, location=(0, 0, p["thickness"] / 2))
plate = bpy.context.active_object
plate.scale = (p["length"], p["width"], p["thickness"])
bpy.ops.object.transform_apply(scale=True)
xs = [(i - (p["cols"] - 1) / 2) * p["pitch_x"] for i in range(p["cols"])]
ys = [(j - (p["rows"] - 1) / 2) * p["pitch_y"] for j in range(p["rows"])]
for x in xs:
    for y in ys:
        bpy.ops.mesh.primitive_cylinder_add(
            vertices=64, radius=p["hole_d"] / 2, depth=p["thickness"] + 2,
            location=(x, y, p["thickness"] / 2),
        )
        cutter = bpy.context.active_object
        mod = plate.modifiers.new("hole", "BOOLEAN")
        mod.operation, mod.object, mod.solver = "DIFFERENCE", cutter, "EXACT"
        bpy.context.view_layer.objects.active = plate
        bpy.ops.object.modifier_apply(modifier=mod.name)
        bpy.data.objects.remove(cutter)
bpy.ops.wm.stl_export(filepath="out.stl")
"""


def test_blender_toolchain_builds_a_verified_part(
    client: InProcessClient, cad_tasks: dict[str, Task]
) -> None:
    chain = runtime.blender_toolchain()
    if not chain.available:
        pytest.skip(f"Blender toolchain unavailable: {chain.reason}")
    task = _pick(cad_tasks, "plate", 1)
    script = "PARAMS = " + repr(json.dumps(task.private["params"])) + "\n" + BLENDER_PLATE
    eid = client.reset(task.ref).episode_id
    client.step(eid, _write("part.py", script))
    res = client.step(eid, _run(toolchain="blender", timeout=120))
    assert res.observation.data["exit_code"] == 0, res.observation.text
    assert res.observation.data["mesh"]["watertight"], res.observation.text
    final = client.step(eid, {"tool": "submit", "arguments": {}})
    verdict = client.verify(eid)
    assert verdict.components["topology"] == 1.0 and verdict.components["features"] == 1.0
    assert final.reward is not None and final.reward >= 0.95, verdict.feedback


@pytest.mark.slow
def test_pack_check_passes_on_a_sample() -> None:
    result = CliRunner().invoke(
        app, ["pack", "check", str(REPO_PACKS / "cad"), "--limit", "1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "every check passed" in result.output


def test_ro_binds_are_checked() -> None:
    """The sandbox spec field the cad family relies on refuses what could hurt."""
    from palaestra.sandbox import SandboxSpec
    from palaestra.sandbox.base import SandboxSpecError, default_cache
    from palaestra.sandbox.bwrap.spec import check_spec

    site = runtime.trimesh_toolchain().site or "/usr/lib"
    images = default_cache() / "images"
    for binds, word in [
        (((site, "/usr/lib/x"),), "/usr"),
        (((site, "/work/site"),), "/work"),
        (((site, "relative"),), "absolute"),
        ((("/no/such/dir", "/opt/x"),), "not an existing directory"),
    ]:
        with pytest.raises(SandboxSpecError, match=word):
            check_spec(SandboxSpec(ro_binds=binds), images)
    check_spec(SandboxSpec(ro_binds=((site, "/opt/palaestra/trimesh"),)), images)


def test_a_toolchain_missing_in_the_sandbox_voids_instead_of_scoring_zero(
    cad_tasks: dict[str, Task], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that does not bind the toolchain is an infrastructure fault, not the agent's."""
    monkeypatch.setattr(runtime.Toolchain, "env", lambda self: {"PYTHONPATH": "/nonexistent"})
    task = _pick(cad_tasks, "hexnut", 1)
    with InProcessClient(make_settings(data_dir=tmp_path / "data")) as c:
        eid = c.reset(task.ref).episode_id
        c.step(eid, _write("part.py", oracle_script(task)))
        res = c.step(eid, _run())
        assert "No module named 'manifold3d'" in res.observation.text and not res.terminated
        c.step(eid, {"tool": "submit", "arguments": {}})
        assert c.verify(eid).status == "void"
