"""cad family: mesh verification time per mesh and render time, beside simpler peers.

For N tasks of every domain of packs/cad (train split, levels cycling), two candidate
meshes are made in-process: the oracle's (the reference's own tessellation, 64 segments a
circle) and a re-tessellated one (32 segments: what an agent's independent model looks
like). Measured, one mesh at a time, single-threaded caller:

- **verify, warm**: `verify_mesh` with the task's reference already built (gate, topology,
  probes, dimensions, volume, exact IoU by manifold3d booleans, wall thickness by ray casts
  through embreex);
- **verify, cold**: the same plus building and measuring the reference from the parameters
  (what one episode's verification costs);
- **peer, naive check**: `trimesh.load` + `is_watertight` + `volume` + `bounds`, what a
  minimal "is it a closed solid of the right size" verifier does;
- **render**: `render_png` (four views, 256×256 each, one ray a pixel through embreex);
- **peer, matplotlib**: the same four views with mpl_toolkits.mplot3d on the Agg backend.

    .venv/bin/python bench/cad.py            # 5 tasks a domain
    .venv/bin/python bench/cad.py --quick    # 1 task a domain
    options: --per-domain N --json PATH

Target: verification p50 ≤ 100 ms a mesh. The last line of stdout is the figures as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from palaestra.envs.cad import builders, reference
from palaestra.envs.cad.render import VIEWS, render_png
from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.loader import load_pack
from palaestra.verifiers import mesh as vm

TARGET_MS = 100.0


def stl_bytes(domain: str, params: dict[str, Any], seg: int) -> bytes:
    old = builders.SEG
    builders.SEG = seg
    try:
        solid, _ = builders.build(domain, params)
    finally:
        builders.SEG = old
    with tempfile.NamedTemporaryFile(suffix=".stl") as fh:
        builders.export_stl(solid, fh.name)
        return Path(fh.name).read_bytes()


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def naive_check(data: bytes) -> None:
    import trimesh

    mesh = trimesh.load(io.BytesIO(data), file_type="stl", force="mesh")
    _ = (mesh.is_watertight, mesh.volume, mesh.bounds)


def matplotlib_render(mesh: Any) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    fig = plt.figure(figsize=(5.12, 5.12), dpi=100)
    lo, hi = mesh.bounds
    for k in range(len(VIEWS)):
        ax = fig.add_subplot(2, 2, k + 1, projection="3d")
        ax.add_collection3d(Poly3DCollection(mesh.triangles, facecolor="tan", linewidth=0))
        ax.set_xlim(lo[0], hi[0])
        ax.set_ylim(lo[1], hi[1])
        ax.set_zlim(lo[2], hi[2])
        ax.view_init(elev=30 if k == 0 else 0, azim=-45 + 45 * k)
        ax.set_axis_off()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def _cold(data: bytes, domain: str, params: dict[str, Any]) -> None:
    vm.verify_mesh(data, reference.reference(domain, params))


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-domain", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    per = 1 if args.quick else args.per_domain
    tasks = sorted(load_pack(REPO_PACKS / "cad", ["cad"]).tasks.values(), key=lambda t: t.id)
    chosen = []
    for domain in sorted({t.domain for t in tasks}):
        mine = [t for t in tasks if t.domain == domain and t.split == "train"]
        chosen += [mine[(i * 7) % len(mine)] for i in range(per)]
    # Warm the imports and embree once, outside the measurements.
    first = chosen[0].private
    vm.verify_mesh(
        stl_bytes(first["domain"], first["params"], 64),
        reference.reference(first["domain"], first["params"]),
    )
    rows: dict[str, list[float]] = {
        k: [] for k in ("cold", "warm", "warm32", "naive", "render", "mpl")
    }
    faces: list[int] = []
    for task in chosen:
        domain, params = task.private["domain"], task.private["params"]
        exact, coarse = stl_bytes(domain, params, 64), stl_bytes(domain, params, 32)
        reference._cached.cache_clear()
        rows["cold"].append(timed(partial(_cold, coarse, domain, params)))
        ref = reference.reference(domain, params)
        rows["warm"].append(timed(partial(vm.verify_mesh, exact, ref)))
        rows["warm32"].append(timed(partial(vm.verify_mesh, coarse, ref)))
        rows["naive"].append(timed(partial(naive_check, coarse)))
        mesh = vm.load_stl(coarse)
        faces.append(len(mesh.faces))
        rows["render"].append(timed(partial(render_png, mesh)))
        rows["mpl"].append(timed(partial(matplotlib_render, mesh)))
    p50 = {k: statistics.median(v) for k, v in rows.items()}
    p95 = {k: p(v, 0.95) for k, v in rows.items()}
    labels = {
        "cold": "verify, cold (reference built)",
        "warm": "verify, warm (oracle mesh)",
        "warm32": "verify, warm (32-segment mesh)",
        "naive": "peer: naive trimesh check",
        "render": "render (4 views, PNG)",
        "mpl": "peer: matplotlib Agg 3D",
    }
    tris = statistics.median(faces)
    print(f"cad bench: {len(chosen)} meshes ({per} a domain), median {tris:.0f} triangles")
    print(f"{'what':34s} {'p50 ms':>9s} {'p95 ms':>9s}")
    for k, label in labels.items():
        print(f"{label:34s} {p50[k]:9.1f} {p95[k]:9.1f}")
    verdict = "PASS" if p50["cold"] <= TARGET_MS else "MISS"
    print(f"verification p50 (cold) {p50['cold']:.1f} ms vs target {TARGET_MS:.0f} ms: {verdict}")
    ratio = p50["cold"] / p50["naive"]
    print(f"ratio verify-cold / naive peer: {ratio:.1f}x (the peer checks far less)")
    print(f"ratio render / matplotlib: {p50['render'] / p50['mpl']:.2f}x")
    figures = {
        "meshes": len(chosen),
        "p50_ms": p50,
        "p95_ms": p95,
        "target_ms": TARGET_MS,
        "verify_target_met": p50["cold"] <= TARGET_MS,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
