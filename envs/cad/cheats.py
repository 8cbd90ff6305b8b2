"""The cad family's oracle and its known cheats, as scripts the agent could have written.

Every script is the builders module's source (`palaestra.envs.cad.builders`, manifold3d only)
followed by a short main: the oracle builds the reference and exports it; each cheat builds
something that is *not* the asked-for part but looks like it to a naive check. They run in
the sandbox like any agent script, so `palaestra pack check` proves each scores ≤ 0.1.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from palaestra.envs import Action, Task
from palaestra.envs.cad.fields import CadPrivate
from palaestra.envs.cad.tasks import OUTPUT, PARAMS_FILE, SCRIPT, sample_params

# The switch that removes each domain's defining feature (read by its builder).
FEATURE_OFF: dict[str, dict[str, bool]] = {
    "plate": {"holes": False},
    "bracket": {"holes": False},
    "flange": {"holes": False},
    "mug": {"handle": False},
    "shaft": {"steps": False},
    "enclosure": {"cavity": False},
    "gear": {"teeth_on": False},
    "tube": {"bore": False},
    "hexnut": {"bore_on": False},
    "pillow_block": {"bore_on": False},
    "tray": {"dividers": False},
    "pulley": {"groove": False},
}
# Parameters that leave every hole, slot, keyway, port and lightening hole solid (the bore
# too): the needle-part cheat builds this and puts needles where the probes look.
SMALL_FEATURES_OFF: dict[str, dict[str, Any]] = {
    "plate": {"holes": False},
    "bracket": {"holes": False},
    "flange": {"holes": False, "bore": 0.0},
    "shaft": {"keyway_l": 0.0, "cross_d": 0.0},
    "enclosure": {"boss_hole_d": 0.0, "port_d": 0.0},
    "gear": {"bore": 0.0, "key_w": 0.0},
    "tube": {"bore": False},
    "hexnut": {"bore_on": False},
    "pillow_block": {"bore_on": False, "bolts": 0},
    "pulley": {"bore": 0.0, "spokes": 0},
}
# The slots and keyways alone (the slots-filled cheat), where a task has them.
SLOTS_OFF: dict[str, dict[str, float]] = {
    "plate": {"slot_l": 0.0},
    "shaft": {"keyway_l": 0.0},
    "gear": {"key_w": 0.0},
    "enclosure": {"port_d": 0.0},
}
# The diameters of the holes and bores of each domain (the oversize/undersize cheats).
HOLE_SIZES: dict[str, tuple[str, ...]] = {
    "plate": ("hole_d",),
    "bracket": ("hole_d",),
    "flange": ("bore", "bolt_d"),
    "shaft": ("cross_d",),
    "enclosure": ("boss_hole_d", "port_d"),
    "gear": ("bore",),
    "tube": ("id", "port_id"),
    "hexnut": ("bore",),
    "pillow_block": ("bore", "bolt_d"),
    "pulley": ("bore", "spoke_hole_d"),
}
HOLE_FACTORS = {"holes-oversize": 1.25, "holes-undersize": 0.75}
SCALE = 1.1
FOREIGN_FILE = "found_part.stl"


BUILDERS_FILE = Path(__file__).with_name("builders.py")


@cache
def builders_source() -> str:
    return BUILDERS_FILE.read_text()


def _script(task: Task, body: str) -> str:
    """builders.py, then a main that loads the parameters (params.json if present) and runs
    `body` with `solid` built and `build`, `export_stl`, `M` in scope."""
    private = CadPrivate.of(task)
    params = json.dumps(private.params, sort_keys=True)
    domain = private.domain
    main = f"""

if __name__ == "__main__":
    import json as _json
    import os as _os

    params = _json.loads({params!r})
    if _os.path.exists({PARAMS_FILE!r}):
        with open({PARAMS_FILE!r}) as fh:
            params = _json.load(fh)
    solid, _probes = build({domain!r}, params)
{body}"""
    return builders_source() + main


def oracle_script(task: Task) -> str:
    return _script(task, f"    export_stl(solid, {OUTPUT!r})\n")


def write_run_submit(script: str, extra: dict[str, str] | None = None) -> list[Action]:
    actions = [
        Action(tool="write_file", arguments={"path": name, "content": text})
        for name, text in (extra or {}).items()
    ]
    actions.append(Action(tool="write_file", arguments={"path": SCRIPT, "content": script}))
    actions.append(Action(tool="run_script", arguments={"path": SCRIPT}))
    actions.append(Action(tool="submit", arguments={}))
    return actions


_BBOX = f"""    b = solid.bounding_box()
    box = M.cube((b[3] - b[0], b[4] - b[1], b[5] - b[2])).translate((b[0], b[1], b[2]))
    export_stl(box, {OUTPUT!r})
"""
_SCALED = f"""    export_stl(solid.scale(({SCALE}, {SCALE}, {SCALE})), {OUTPUT!r})
"""
_SOUP = f"""    import numpy as np
    mesh = solid.to_mesh()
    tri = np.asarray(mesh.vert_properties)[:, :3][np.asarray(mesh.tri_verts)]
    tri = tri + np.random.default_rng(0).normal(0, 0.05, tri.shape)  # unshared corners
    with open({OUTPUT!r}, "w") as fh:
        fh.write("solid soup\\n")
        for t in tri:
            fh.write("facet normal 0 0 0\\nouter loop\\n")
            for v in t:
                fh.write("vertex %f %f %f\\n" % tuple(v))
            fh.write("endloop\\nendfacet\\n")
        fh.write("endsolid soup\\n")
"""
_NON_MANIFOLD = f"""    import numpy as np
    mesh = solid.to_mesh()
    tri = np.asarray(mesh.vert_properties)[:, :3][np.asarray(mesh.tri_verts)]
    tri = np.concatenate([tri, tri])  # every face twice: each edge joins four faces
    with open({OUTPUT!r}, "w") as fh:
        fh.write("solid twice\\n")
        for t in tri:
            fh.write("facet normal 0 0 0\\nouter loop\\n")
            for v in t:
                fh.write("vertex %f %f %f\\n" % tuple(v))
            fh.write("endloop\\nendfacet\\n")
        fh.write("endsolid twice\\n")
"""
_EMPTY = f"""    open({OUTPUT!r}, "wb").close()
"""
# A block (or the part's convex hull) with needle holes at the probe points that must be
# empty: through needles where the genus needs them, blind pits elsewhere; it passes the
# topology and every probe without the task's features.
_NEEDLES = """    b = solid.bounding_box()
    base = {base}
    lo, hi = (b[0], b[1], b[2]), (b[3], b[4], b[5])
    inside = [p for p, i in _probes if i]
    r, cuts, through = 0.2, [], base.genus()

    def _column_clear(x, y, z0, z1):
        return not any(abs(x - a) < 3 * r and abs(y - c) < 3 * r and z0 <= z <= z1
                       for a, c, z in inside)

    for (x, y, z), i in _probes:
        if i:
            continue
        if through < solid.genus() and _column_clear(x, y, lo[2] - 1, hi[2] + 1):
            cuts.append(M.cylinder(hi[2] - lo[2] + 2, r, r, 8).translate((x, y, lo[2] - 1)))
            through += 1
        elif _column_clear(x, y, z - 0.5, hi[2] + 1):
            cuts.append(M.cylinder(hi[2] - z + 1.5, r, r, 8).translate((x, y, z - 0.5)))
        elif _column_clear(x, y, lo[2] - 1, z + 0.5):
            cuts.append(M.cylinder(z - lo[2] + 1.5, r, r, 8).translate((x, y, lo[2] - 1)))
    k = 0
    while through < solid.genus():
        x, y = lo[0] + 0.6 + 0.6 * k, lo[1] + 0.6
        k += 1
        if _column_clear(x, y, lo[2] - 1, hi[2] + 1):
            cuts.append(M.cylinder(hi[2] - lo[2] + 2, r, r, 8).translate((x, y, lo[2] - 1)))
            through += 1
    for c in cuts:
        base = base - c
{tail}    export_stl(base, {out!r})
"""
_BLOCK = "M.cube((b[3] - b[0], b[4] - b[1], b[5] - b[2])).translate((b[0], b[1], b[2]))"
_NEEDLE_BLOCK = _NEEDLES.format(base=_BLOCK, out=OUTPUT, tail="")
_NEEDLE_HULL = _NEEDLES.format(base="solid.hull()", out=OUTPUT, tail="")
# The part itself with its small features (holes, slots, keyways, ports, lightening holes)
# left solid, a needle at each of their probe points: the real part everywhere else.
_NEEDLE_PART = _NEEDLES.format(base="build(_domain, _solid_params)[0]", out=OUTPUT, tail="")
# The needle block carved where the v2 verifier looked: 0.4 mm cubes cut at each of its 512
# fixed surface samples (seed 4321) that lie outside the part, so that every sampled point
# beside the surface is on its right side, and nothing else of the part is modelled.
_CARVE = """    import numpy as np
    import trimesh
    _m = solid.to_mesh()
    ref = trimesh.Trimesh(np.asarray(_m.vert_properties)[:, :3], np.asarray(_m.tri_verts),
                          process=False)
    pts, fi = trimesh.sample.sample_surface(ref, 512, seed=4321)
    outside = pts + ref.face_normals[fi] * 0.5
    outside = outside[~ref.contains(outside)]
    holes = [M.cube((0.4, 0.4, 0.4), True).translate(tuple(map(float, q))) for q in outside]
    if holes:
        base = base - M.batch_boolean(holes, m3d.OpType.Add)
"""
_SAMPLE_CARVED = _NEEDLES.format(base=_BLOCK, out=OUTPUT, tail=_CARVE)
_HULL = f"""    export_stl(solid.hull(), {OUTPUT!r})
"""
# The part rebuilt from 10 x 10 x 10 cells of its bounding box: a cell is kept where the
# part fills half of it. The right size and roughly the right shape, none of the detail.
_VOXELS = f"""    b = solid.bounding_box()
    n = 10
    step = [(b[3 + i] - b[i]) / n for i in range(3)]
    cells = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                at = (b[0] + i * step[0], b[1] + j * step[1], b[2] + k * step[2])
                cell = M.cube(tuple(step)).translate(at)
                if (solid ^ cell).volume() >= 0.5 * step[0] * step[1] * step[2]:
                    # overlapping a little: cells that touch along an edge are non-manifold
                    grown = M.cube(tuple(s + 0.2 for s in step))
                    cells.append(grown.translate(tuple(a - 0.1 for a in at)))
    blob = M.batch_boolean(cells, m3d.OpType.Add)
    c = blob.bounding_box()
    fit = tuple((b[3 + i] - b[i]) / (c[3 + i] - c[i]) for i in range(3))
    export_stl(blob.translate((-c[0], -c[1], -c[2])).scale(fit).translate(b[:3]), {OUTPUT!r})
"""


def _scaled(factors: tuple[float, float, float]) -> str:
    return f"    export_stl(solid.scale({factors!r}), {OUTPUT!r})\n"


# The part mirrored through the plane (of x, y or z) that changes it most.
_MIRROR = f"""    def _centred(s):
        b = s.bounding_box()
        return s.translate((-(b[0] + b[3]) / 2, -(b[1] + b[4]) / 2, -(b[2] + b[5]) / 2))

    part = _centred(solid)
    mirrors = [_centred(part.mirror(n)) for n in ((1, 0, 0), (0, 1, 0), (0, 0, 1))]
    export_stl(min(mirrors, key=lambda m: (m ^ part).volume()), {OUTPUT!r})
"""
MIRROR_DISTINCT = 0.97  # the mirror is another part where its IoU with the part is below this

PRINT_PASS = 'print("PASS")\nprint("all checks passed: 1.0")\n'


def _without_feature(task: Task) -> str:
    domain = CadPrivate.of(task).domain
    body = f"    params.update({FEATURE_OFF[domain]!r})\n"
    body += f"    solid, _probes = build({domain!r}, params)\n"
    body += f"    export_stl(solid, {OUTPUT!r})\n"
    return _script(task, body)


def _with_params(task: Task, overrides: dict[str, Any], body: str) -> str:
    """A script whose `_solid_params` are the task's (or params.json's) with `overrides`."""
    domain = CadPrivate.of(task).domain
    head = f"    _domain = {domain!r}\n    _solid_params = dict(params, **{overrides!r})\n"
    return _script(task, head + body)


def _holes_scaled(task: Task, factor: float) -> str:
    """The part with every hole and bore `factor` times its diameter."""
    keys = HOLE_SIZES[CadPrivate.of(task).domain]
    body = (
        f"    for _k in {keys!r}:\n"
        "        if _solid_params.get(_k):\n"
        f"            _solid_params[_k] = round(_solid_params[_k] * {factor!r}, 3)\n"
        f"    export_stl(build(_domain, _solid_params)[0], {OUTPUT!r})\n"
    )
    return _with_params(task, {}, body)


def small_feature_cheats(task: Task) -> list[tuple[str, list[Action]]]:
    """The cheats on the small features (holes, slots) a task has: filled and needled,
    slots filled, every hole drilled 25 % too large or too small."""
    private = CadPrivate.of(task)
    domain, params = private.domain, private.params
    out = []
    off = SMALL_FEATURES_OFF.get(domain, {})
    # A switch (False) turns off a feature every task has; a size (0) one the task may lack.
    if any(v is False or params.get(k) for k, v in off.items()):
        script = _with_params(task, off, _NEEDLE_PART)
        out.append(("needle-part", write_run_submit(script)))
    slots = {k: v for k, v in SLOTS_OFF.get(domain, {}).items() if params.get(k)}
    if slots:
        script = _with_params(task, slots, _NEEDLE_PART)
        out.append(("slots-filled", write_run_submit(script)))
    if any(params.get(k) for k in HOLE_SIZES.get(domain, ())):
        for name, factor in HOLE_FACTORS.items():
            out.append((name, write_run_submit(_holes_scaled(task, factor))))
    return out


def foreign_params(domain: str, params: dict[str, Any], level: int) -> dict[str, Any]:
    """Parameters of another part of the same domain whose every extent differs by > 8%."""
    from palaestra.envs.cad import builders  # manifold3d: imported only when needed

    solid, _ = builders.build(domain, params)
    b = solid.bounding_box()
    ext = [b[3] - b[0], b[4] - b[1], b[5] - b[2]]
    for k in range(200):
        other = sample_params(domain, 0, level, salt=f"/elsewhere{k}")
        ob = builders.build(domain, other)[0].bounding_box()
        oext = [ob[3] - ob[0], ob[4] - ob[1], ob[5] - ob[2]]
        if all(abs(o - e) > 0.08 * e for o, e in zip(oext, ext, strict=True)):
            return other
    raise RuntimeError(f"no foreign {domain} part differs enough from {params}")


def ascii_stl(solid: Any) -> str:
    """An ASCII STL of a manifold3d solid (a file 'brought from elsewhere' is text here)."""
    import numpy as np

    mesh = solid.to_mesh()
    tri = np.asarray(mesh.vert_properties)[:, :3][np.asarray(mesh.tri_verts)]
    lines = ["solid found"]
    for t in tri:
        lines.append("facet normal 0 0 0\nouter loop")
        lines.extend(f"vertex {v[0]:.6f} {v[1]:.6f} {v[2]:.6f}" for v in t)
        lines.append("endloop\nendfacet")
    lines.append("endsolid found\n")
    return "\n".join(lines)


def _foreign(task: Task) -> list[Action]:
    from palaestra.envs.cad import builders

    private = CadPrivate.of(task)
    domain = private.domain
    other = foreign_params(domain, private.params, private.level)
    stl = ascii_stl(builders.build(domain, other)[0])
    script = f"import shutil\nshutil.copyfile({FOREIGN_FILE!r}, {OUTPUT!r})\n"
    return write_run_submit(script, {FOREIGN_FILE: stl})


def all_cheats(task: Task) -> list[tuple[str, list[Action]]]:
    out = [
        ("bounding-box", write_run_submit(_script(task, _BBOX))),
        ("without-feature", write_run_submit(_without_feature(task))),
        ("scaled-copy", write_run_submit(_script(task, _SCALED))),
        ("triangle-soup", write_run_submit(_script(task, _SOUP))),
        ("non-manifold", write_run_submit(_script(task, _NON_MANIFOLD))),
        ("empty-mesh", write_run_submit(_script(task, _EMPTY))),
        ("foreign-mesh", _foreign(task)),
        ("print-pass", write_run_submit(PRINT_PASS)),
        ("needle-block", write_run_submit(_script(task, _NEEDLE_BLOCK))),
        ("convex-hull", write_run_submit(_script(task, _HULL))),
        ("needle-hull", write_run_submit(_script(task, _NEEDLE_HULL))),
        ("voxel-blob", write_run_submit(_script(task, _VOXELS))),
        ("scaled-1.05", write_run_submit(_script(task, _scaled((1.05, 1.05, 1.05))))),
        ("scaled-0.95", write_run_submit(_script(task, _scaled((0.95, 0.95, 0.95))))),
        ("stretched-x-1.05", write_run_submit(_script(task, _scaled((1.05, 1.0, 1.0))))),
        ("sample-carved", write_run_submit(_script(task, _SAMPLE_CARVED))),
        *small_feature_cheats(task),
    ]
    if mirror_is_another_part(task):
        out.append(("mirrored", write_run_submit(_script(task, _MIRROR))))
    return out


def mirror_is_another_part(task: Task) -> bool:
    """Whether some mirror image of the part is a different part (an asymmetric part): a
    symmetric part's mirror is the part itself, which rightly scores 1."""
    from palaestra.envs.cad import builders

    private = CadPrivate.of(task)
    solid = builders.build(private.domain, private.params)[0]

    def centred(s: Any) -> Any:
        b = s.bounding_box()
        return s.translate((-(b[0] + b[3]) / 2, -(b[1] + b[4]) / 2, -(b[2] + b[5]) / 2))

    part = centred(solid)
    for normal in ((1, 0, 0), (0, 1, 0), (0, 0, 1)):
        inter = (centred(part.mirror(normal)) ^ part).volume()
        if inter / (2 * part.volume() - inter) < MIRROR_DISTINCT:
            return True
    return False
