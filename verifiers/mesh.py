"""Mesh verification: is an STL the solid a task asked for? Decided by geometry, never text.

Pipeline (`verify_mesh`), each stage a component in [0, 1]:

1. **gate** -- the file parses as STL, has faces (at most `MAX_FACES`), finite vertices, is
   watertight with consistently wound outward faces (positive volume) and manifold3d
   accepts it as a manifold. Failing the gate scores 0: nothing else is measured.
2. **identity** -- what makes the part *that* part:
   ``topology`` (1 when the body count and the genus -- the number of through holes and
   handles -- equal the reference's) and ``features`` (the fraction of probe points on the
   right side: inside a wall, inside a hole, between gear teeth…).
3. **fidelity**, the weighted mean `WEIGHTS` (renormalised over the components that apply):
   ``dimensions`` (bounding-box extents per axis), ``volume``, ``iou`` (volumetric IoU
   with the reference, exact, by manifold3d booleans) and ``wall`` (the thin-wall
   thickness, for parts with walls: the 5th percentile of inward ray lengths from surface
   samples, measured the same way on both solids).

reward = fidelity if the identity holds (topology 1 and every probe right), else
0.1 × fidelity × features: a solid that is not the asked-for shape -- a missing hole, a mug
without its handle, a bounding box -- earns at most 0.1 however close its size is.

4. **gates**, multiplied into the reward: IoU, volume and the worst axis's extent; ``fill``
   (the share of *each* void of the reference -- a piece of its hull minus the part: a hole,
   a slot, a gap between teeth -- that the candidate fills, the worst void counting) and
   ``surface`` (verifiers/mesh_surface.py: every surface patch of the reference, a small
   hole's wall as densely as a big face, classified by the candidate, and every patch of the
   candidate by the reference, with an offset that follows the feature's size; the worst
   patch counts). So a feature is graded whatever its share of the part: a needle where a
   hole should be, a hole 25 % too large, a filled keyway score 0, and no point set the
   agent could aim at is fixed (the samples come from a per-process secret).

The candidate is translated so that its bounding-box centre is the reference's before the
probes and the IoU: placement is forgiven, orientation and size are not.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from palaestra.verifiers.mesh_surface import Pairs, score_pairs, secret_rng, surface_pairs

VERSION = "3.0.0"
MAX_FACES = 1_000_000
WEIGHTS = {"dimensions": 0.25, "volume": 0.25, "iou": 0.4, "wall": 0.1}
NOT_IDENTICAL_FACTOR = 0.1
# (full credit up to, zero credit from): relative errors, except IoU (an overlap ratio).
DIM_TOL = (0.01, 0.05)
DIM_ABS_MM = 0.2  # an extent within 0.2 mm is exact whatever its size
VOLUME_TOL = (0.015, 0.10)
IOU_TOL = (0.97, 0.85)
WALL_TOL = (0.08, 0.15)
WALL_SAMPLES = 2048
# Gates: fidelity is multiplied by the product of these, so a part that is not the task's part
# (a block with needle holes, a convex hull, a voxel blob, a scaled or mirrored copy) scores
# near 0 however its other measures look. (full credit up to, zero credit from).
IOU_GATE = (0.95, 0.85)
VOLUME_GATE = (0.03, 0.10)
DIM_GATE = (0.01, 0.04)  # the worst axis, relative (an extent within DIM_ABS_MM is exact)
# `fill`: the share of each of the reference's voids -- the connected pieces of its convex
# hull minus the part: a hole, a cavity, a slot, a gap between teeth, the space between
# steps -- that the candidate fills; the gate takes the worst void, however small it is.
FILL_GATE = (0.06, 0.20)  # about 3 % and 10 % of a hole's diameter
MIN_VOID_MM3 = 0.5  # pieces below this are slivers of the hull, not features
SLIVER_MM3 = 1e-3  # a filled piece below this is a seam, not worth a boolean
# `surface` (verifiers/mesh_surface.py): pairs of points either side of each surface, every
# patch sampled (a small hole's wall as densely as the plate's face), both ways: reference
# patches classified by the candidate, candidate patches by the reference.
SURFACE_PER_PATCH = 32
SURFACE_AREA_SAMPLES = 1024
BACK_PER_PATCH = 16
BACK_AREA_SAMPLES = 1024
BACK_MAX_PATCHES = 4000
SURFACE_GATE = (0.9, 0.6)  # the worst patch's score, of either surface
WALL_QUANTILE = 5.0
_NUDGE = np.array([1e-5, 1.3e-5, 0.7e-5])


def _xyz(v: Any) -> str:
    return " x ".join(f"{float(x):.4g}" for x in v)


class MeshError(ValueError):
    """The bytes are not a usable closed solid; the message says what to fix."""


@dataclass
class MeshSummary:
    """What `run_script` reports about an exported mesh."""

    faces: int = 0
    watertight: bool = False
    winding_consistent: bool = False
    volume: float = 0.0
    bounds: list[list[float]] = field(default_factory=list)
    extents: list[float] = field(default_factory=list)
    bodies: int = 0
    genus: int | None = None
    errors: list[str] = field(default_factory=list)

    def text(self) -> str:
        if not self.faces:
            return "mesh: " + "; ".join(self.errors)
        lo, hi = self.bounds if self.bounds else ([0.0] * 3, [0.0] * 3)
        parts = [
            f"faces {self.faces}",
            f"watertight {self.watertight}",
            f"volume {self.volume:.6g} mm^3",
            f"bounds x [{lo[0]:.4g}, {hi[0]:.4g}] y [{lo[1]:.4g}, {hi[1]:.4g}] "
            f"z [{lo[2]:.4g}, {hi[2]:.4g}]",
            "size " + _xyz(self.extents) + " mm",
            f"bodies {self.bodies}",
            f"genus {self.genus if self.genus is not None else '?'}",
        ]
        text = "mesh: " + ", ".join(parts)
        if self.errors:
            text += "\nproblems: " + "; ".join(self.errors)
        return text


@dataclass(frozen=True)
class Reference:
    """The exact reference solid of a task and what is measured on it once."""

    manifold: Any
    extents: np.ndarray
    center: np.ndarray
    volume: float
    genus: int
    bodies: int
    probes: tuple[tuple[tuple[float, float, float], bool], ...]
    wall: float | None
    voids: tuple[tuple[Any, float], ...] = ()  # each piece of hull minus part, its volume
    void_all: Any = None  # hull minus part, every piece
    void_boxes: Any = None  # (len(voids), 6) bounding boxes of `voids`
    surface: Pairs | None = None  # pairs either side of the reference's surface
    mesh: Any = None  # its trimesh (the candidate's surface pairs are classified by it)


@dataclass
class MeshReport:
    reward: float
    passed: bool
    components: dict[str, float]
    feedback: str


def _trimesh() -> Any:
    import trimesh  # deferred: a server that never verifies a mesh never pays for the import

    return trimesh


def _m3d() -> Any:
    import manifold3d

    return manifold3d


def load_stl(data: bytes) -> Any:
    """Parse STL bytes into a trimesh with merged vertices; MeshError if it is not a mesh."""
    if not data:
        raise MeshError("the STL file is empty")
    trimesh = _trimesh()
    try:
        mesh = trimesh.load(io.BytesIO(data), file_type="stl", process=True, force="mesh")
    except Exception as exc:  # trimesh raises many types on garbage
        raise MeshError(f"not a readable STL file ({type(exc).__name__}: {exc})") from None
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise MeshError("the STL file holds no triangles")
    if len(mesh.faces) > MAX_FACES:
        raise MeshError(f"{len(mesh.faces)} triangles, over the limit of {MAX_FACES}")
    if not np.isfinite(mesh.vertices).all():
        raise MeshError("the mesh has NaN or infinite vertex coordinates")
    return mesh


def _genus(mesh: Any, bodies: int) -> int:
    """Total genus of a closed mesh from its Euler characteristic: sum over bodies."""
    return round((2 * bodies - int(mesh.euler_number)) / 2)


def summarize(data: bytes) -> tuple[MeshSummary, Any]:
    """Describe an exported mesh (and return it, or None if it could not be read)."""
    summary = MeshSummary()
    try:
        mesh = load_stl(data)
    except MeshError as exc:
        summary.errors.append(str(exc))
        return summary, None
    summary.faces = len(mesh.faces)
    summary.watertight = bool(mesh.is_watertight)
    summary.winding_consistent = bool(mesh.is_winding_consistent)
    lo, hi = mesh.bounds
    summary.bounds = [[float(x) for x in lo], [float(x) for x in hi]]
    summary.extents = [float(x) for x in hi - lo]
    summary.bodies = int(mesh.body_count)
    if summary.watertight:
        summary.volume = float(mesh.volume)
        summary.genus = _genus(mesh, summary.bodies)
    summary.errors = _gate_problems(mesh, summary)
    return summary, mesh


def _gate_problems(mesh: Any, s: MeshSummary) -> list[str]:
    problems = []
    if not s.watertight:
        problems.append(
            "not watertight: some edges do not join exactly two faces (open or non-manifold "
            "mesh, or a triangle soup); build one closed solid, e.g. with manifold3d booleans"
        )
    elif not s.winding_consistent:
        problems.append("faces are not consistently wound")
    elif s.volume <= 0:
        problems.append("negative volume: the faces point inward; flip their winding")
    return problems


def to_manifold(mesh: Any) -> Any:
    """A manifold3d solid from a trimesh; MeshError if manifold3d refuses it."""
    m3d = _m3d()
    verts = np.ascontiguousarray(mesh.vertices, dtype=np.float32)
    faces = np.ascontiguousarray(mesh.faces, dtype=np.uint32)
    solid = m3d.Manifold(m3d.Mesh(vert_properties=verts, tri_verts=faces))
    status = solid.status()
    if status != m3d.Error.NoError:
        raise MeshError(f"manifold3d does not accept it as a closed manifold solid ({status.name})")
    return solid


def manifold_mesh(solid: Any) -> Any:
    """The trimesh of a manifold3d solid."""
    out = solid.to_mesh()
    verts = np.asarray(out.vert_properties, dtype=np.float64)[:, :3]
    return _trimesh().Trimesh(vertices=verts, faces=np.asarray(out.tri_verts), process=False)


def wall_thickness(mesh: Any, samples: int = WALL_SAMPLES) -> float:
    """The thin-wall thickness: a low percentile of inward ray lengths from surface samples.

    Deterministic (a fixed sampling seed), and measured the same way on candidate and
    reference, so the comparison does not depend on how either is tessellated."""
    trimesh = _trimesh()
    points, face_idx = trimesh.sample.sample_surface(mesh, samples, seed=12345)
    normals = mesh.face_normals[face_idx]
    origins = points - normals * 1e-4
    locations, index_ray, _ = mesh.ray.intersects_location(origins, -normals, multiple_hits=False)
    if len(index_ray) == 0:
        return 0.0
    dist = np.linalg.norm(locations - origins[index_ray], axis=1)
    return float(np.percentile(dist, WALL_QUANTILE))


def make_reference(
    solid: Any, probes: list[tuple[tuple[float, float, float], bool]], walls: bool
) -> Reference:
    """Measure the reference solid once (its wall statistic only when the part has walls)."""
    lo, hi = (np.asarray(b, dtype=np.float64) for b in _bbox(solid))
    ref_mesh = manifold_mesh(solid)
    mesh = ref_mesh if walls else None
    void_all = solid.hull() - solid
    pieces = ((v, float(v.volume())) for v in void_all.decompose())
    voids = tuple((v, vol) for v, vol in pieces if vol >= MIN_VOID_MM3)
    boxes = np.array([v.bounding_box() for v, _ in voids], dtype=np.float64).reshape(-1, 6)
    surface = surface_pairs(ref_mesh, SURFACE_PER_PATCH, SURFACE_AREA_SAMPLES, secret_rng())
    return Reference(
        manifold=solid,
        extents=hi - lo,
        center=(hi + lo) / 2,
        volume=float(solid.volume()),
        genus=int(solid.genus()),
        bodies=len(solid.decompose()),
        probes=tuple((tuple(map(float, pt)), bool(inside)) for pt, inside in probes),  # type: ignore[misc]
        wall=wall_thickness(mesh) if mesh is not None else None,
        voids=voids,
        void_all=void_all,
        void_boxes=boxes,
        surface=surface,
        mesh=ref_mesh,
    )


def _bbox(solid: Any) -> tuple[list[float], list[float]]:
    b = solid.bounding_box()
    return list(b[:3]), list(b[3:])


def _ramp(err: float, full: float, zero: float) -> float:
    """1 up to `full`, 0 from `zero`, linear between (works for rising or falling scales)."""
    if full < zero:
        return float(np.clip((zero - err) / (zero - full), 0.0, 1.0))
    return float(np.clip((err - zero) / (full - zero), 0.0, 1.0))


def verify_mesh(data: bytes, ref: Reference) -> MeshReport:
    """Score STL bytes against a reference (see the module docstring)."""
    summary, mesh = summarize(data)
    if mesh is None or summary.errors:
        return MeshReport(0.0, False, {"gate": 0.0}, "gate failed: " + "; ".join(summary.errors))
    try:
        cand = to_manifold(mesh)
    except MeshError as exc:
        return MeshReport(0.0, False, {"gate": 0.0}, f"gate failed: {exc}")
    comps: dict[str, float] = {"gate": 1.0}
    notes: list[str] = []
    topo_ok = summary.bodies == ref.bodies and summary.genus == ref.genus
    comps["topology"] = 1.0 if topo_ok else 0.0
    if not topo_ok:
        notes.append(
            f"topology: {summary.bodies} bodies of total genus {summary.genus} "
            f"(through holes/handles), expected {ref.bodies} of genus {ref.genus}"
        )
    ext = np.asarray(summary.extents)
    shift = ref.center - (np.asarray(summary.bounds[0]) + np.asarray(summary.bounds[1])) / 2
    if ref.probes:
        pts = np.array([p for p, _ in ref.probes], dtype=np.float64) - shift
        want = np.array([inside for _, inside in ref.probes])
        got = np.asarray(mesh.contains(pts), dtype=bool)
        right = got == want
        comps["features"] = float(right.mean())
        if not right.all():
            notes.append(f"features: {int((~right).sum())} of {len(right)} probe points wrong")
    else:
        comps["features"] = 1.0
    errs = np.abs(ext - ref.extents) / np.maximum(ref.extents, 1e-9)
    axis = [
        1.0 if abs(e - r) <= DIM_ABS_MM else _ramp(float(rel), *DIM_TOL)
        for e, r, rel in zip(ext, ref.extents, errs, strict=True)
    ]
    comps["dimensions"] = float(np.mean(axis))
    if comps["dimensions"] < 1:
        notes.append(f"dimensions: size {_xyz(ext)} mm, expected {_xyz(ref.extents)}")
    vol_err = abs(summary.volume - ref.volume) / ref.volume
    comps["volume"] = _ramp(vol_err, *VOLUME_TOL)
    if comps["volume"] < 1:
        notes.append(f"volume: {summary.volume:.6g} mm^3, expected {ref.volume:.6g}")
    # A 10 nm nudge: exactly coincident surfaces are manifold3d's slowest boolean (about 3x).
    moved = cand.translate(tuple(float(x) for x in shift + _NUDGE))
    inter = float((moved ^ ref.manifold).volume())
    union = summary.volume + ref.volume - inter
    iou = inter / union if union > 0 else 0.0
    comps["iou"] = _ramp(iou, *IOU_TOL)
    if comps["iou"] < 1:
        notes.append(f"IoU with the reference {iou:.4f}")
    gates = {
        "iou_gate": _ramp(iou, *IOU_GATE),
        "volume_gate": _ramp(vol_err, *VOLUME_GATE),
        "dim_gate": min(
            1.0 if abs(e - r) <= DIM_ABS_MM else _ramp(float(rel), *DIM_GATE)
            for e, r, rel in zip(ext, ref.extents, errs, strict=True)
        ),
    }
    if ref.voids:
        fills = _void_fills(moved, ref)
        fill = max(fills)
        comps["fill"] = fill
        gates["fill_gate"] = _ramp(fill, *FILL_GATE)
        if gates["fill_gate"] < 1:
            full = sum(f > FILL_GATE[0] for f in fills)
            notes.append(
                f"fill: the part fills {full} of the {len(fills)} holes, cavities and gaps it "
                f"should leave empty (the worst to {fill:.1%})"
            )
    _surface_gate(data, mesh, ref, shift, comps, gates, notes)
    comps.update(gates)
    # The product, not the lowest: each gate is separate evidence that this is another part
    # (a coarse voxel blob sits at 0.5-0.6 on four gates at once: 0.1 together, 0.5 alone).
    gate = float(np.prod(list(gates.values())))
    weights = dict(WEIGHTS)
    if ref.wall is not None:
        wall = wall_thickness(mesh)
        comps["wall"] = _ramp(abs(wall - ref.wall) / ref.wall, *WALL_TOL)
        if comps["wall"] < 1:
            notes.append(f"wall thickness {wall:.3g} mm, expected {ref.wall:.3g}")
    else:
        weights.pop("wall")
    fidelity = sum(w * comps[k] for k, w in weights.items()) / sum(weights.values())
    identity = topo_ok and comps["features"] == 1.0
    reward = fidelity if identity else NOT_IDENTICAL_FACTOR * fidelity * comps["features"]
    reward *= gate
    reward = float(np.clip(reward, 0.0, 1.0))
    passed = identity and reward >= 0.999
    feedback = "all checks passed" if not notes else "; ".join(notes)
    return MeshReport(reward, passed, comps, feedback)


def _void_fills(moved: Any, ref: Reference) -> list[float]:
    """The share of each void of the reference that `moved` fills: one intersection with all
    the voids, each of its pieces credited to the void whose box holds it (by booleans with
    the voids it touches where no single box does): one boolean, not one a void."""
    filled = np.zeros(len(ref.voids))
    boxes = ref.void_boxes
    tol = 1e-6
    for piece in (moved ^ ref.void_all).decompose():
        vol = float(piece.volume())
        if vol <= 0:
            continue
        b = np.asarray(piece.bounding_box(), dtype=np.float64)
        holds = np.flatnonzero(
            (boxes[:, :3] <= b[:3] + tol).all(1) & (boxes[:, 3:] >= b[3:] - tol).all(1)
        )
        if len(holds) == 1:
            filled[holds[0]] += vol
            continue
        touch = np.flatnonzero((boxes[:, :3] <= b[3:]).all(1) & (boxes[:, 3:] >= b[:3]).all(1))
        if vol < SLIVER_MM3:  # a seam between coincident surfaces: credit every void it touches
            filled[touch] += vol
            continue
        for j in touch:
            filled[j] += float((piece ^ ref.voids[j][0]).volume())
    return [float(f / vol) for f, (_, vol) in zip(filled, ref.voids, strict=True)]


def _surface_gate(
    data: bytes,
    mesh: Any,
    ref: Reference,
    shift: np.ndarray,
    comps: dict[str, float],
    gates: dict[str, float],
    notes: list[str],
) -> None:
    """Both ways, patch by patch: the reference's surface pairs against the candidate (a
    filled or resized hole, a missing slot), the candidate's against the reference (needles,
    pits, spikes, a hollow shell)."""
    if ref.surface is None or ref.mesh is None:
        return
    fwd = score_pairs(ref.surface.shifted(-shift), mesh)
    back_pairs = surface_pairs(
        mesh, BACK_PER_PATCH, BACK_AREA_SAMPLES, secret_rng(data), BACK_MAX_PATCHES
    )
    back = score_pairs(back_pairs.shifted(shift), ref.mesh)
    comps["surface"] = min(fwd.overall, back.overall)
    comps["surface_patch"] = fwd.worst
    comps["surface_back"] = back.worst
    gates["surface_gate"] = _ramp(min(fwd.worst, back.worst), *SURFACE_GATE)
    if fwd.wrong_patches:
        notes.append(
            f"surface: {fwd.wrong_patches} of the reference's {ref.surface.patches} surface "
            f"patches (hole and slot walls, faces, flanks) are not reproduced; the worst has "
            f"{fwd.worst:.0%} of the points beside it on their side"
        )
    if back.wrong_patches:
        notes.append(
            f"surface: {back.wrong_patches} of the part's surface patches lie off the "
            f"reference's surface (needles, pits, spikes, extra walls); the worst has "
            f"{back.worst:.0%} of its points on their side"
        )
