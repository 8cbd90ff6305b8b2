"""Surface fidelity of a mesh against another, patch by patch, both ways.

A surface is split into *patches*: the faces joined across edges where the surface bends by
less than `PATCH_ANGLE_DEG` -- a hole's wall, a slot's side, a tooth's flank, a face of the
plate. Every patch gets `per_patch` points (however small its area: a 3 mm hole's wall as
many as the plate's top), plus `area_samples` spread by area. Each point gives a pair, one
point `delta` inside the surface and one `delta` outside; a pair is kept where the mesh
itself puts both on their side (near an edge an offset point can land elsewhere).

`delta` follows the local size of the shape: `OFFSET_FRACTION` of the gap across the
surface at that point (the hole's diameter, the wall's thickness, measured by two rays),
at least `CURVE_FRACTION` of the surface's radius of curvature there (so that a circle
tessellated more coarsely than the reference is no error), within `OFFSET_MM`. A hole
drilled 10 % of its diameter too large or small, or filled round a needle, puts the pairs
of its wall on the wrong side; a hole drilled within a few per cent of its size does not.

The score of a patch is the lower of the shares of its inside and its outside points that
the *other* mesh puts on the same side; a surface's score is its worst patch's (with at
least `MIN_PAIRS` pairs each side), so a wrong small feature counts as much as a wrong big
one and many right patches cannot dilute it.

Points are drawn from a seed the agent never sees (`secret_rng`): the reference's once per
reference, the candidate's once per mesh, so there is no fixed set of points to aim at.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

PATCH_ANGLE_DEG = 30.0
OFFSET_FRACTION = 0.04
CURVE_FRACTION = 0.01
OFFSET_MM = (0.1, 0.5)
MIN_PAIRS = 6
_EPS = 1e-4
_SECRET = secrets.token_bytes(16)  # per process: the sample points cannot be predicted


@dataclass(frozen=True)
class Pairs:
    """Points just inside and just outside a surface, and the patch each belongs to."""

    inside: np.ndarray  # (n, 3)
    outside: np.ndarray  # (n, 3)
    patch: np.ndarray  # (n,) int
    patches: int  # how many patches the surface has

    def shifted(self, shift: np.ndarray) -> Pairs:
        return Pairs(self.inside + shift, self.outside + shift, self.patch, self.patches)


def secret_rng(data: bytes = b"") -> np.random.Generator:
    """A generator seeded from this process's secret (and `data`, for repeatable draws)."""
    digest = hashlib.sha256(_SECRET + data).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def patch_labels(mesh: Any) -> np.ndarray:
    """A patch number for each face: faces joined where the surface bends less than
    `PATCH_ANGLE_DEG`."""
    import trimesh

    smooth = mesh.face_adjacency_angles < np.radians(PATCH_ANGLE_DEG)
    edges = np.asarray(mesh.face_adjacency[smooth])
    labels = trimesh.graph.connected_component_labels(  # type: ignore[no-untyped-call]
        edges, node_count=len(mesh.faces)
    )
    return np.asarray(labels, dtype=np.int64)


def _sample(
    mesh: Any,
    labels: np.ndarray,
    per_patch: int,
    area_samples: int,
    rng: np.random.Generator,
    max_patches: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Points on the surface: `per_patch` in each patch (by area within it; a random
    `max_patches` of them if there are more) and `area_samples` by area overall."""
    area = np.asarray(mesh.area_faces, np.float64)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    cum = np.cumsum(area[order])
    ids, starts = np.unique(sorted_labels, return_index=True)
    ends = np.append(starts[1:], len(order))
    if max_patches is not None and len(ids) > max_patches:
        pick = rng.choice(len(ids), max_patches, replace=False)
        ids, starts, ends = ids[pick], starts[pick], ends[pick]
    lo = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    hi = cum[ends - 1]
    u = rng.random((len(ids), per_patch))
    targets = (lo[:, None] + u * (hi - lo)[:, None]).ravel()
    slots = np.searchsorted(cum, targets, side="right")
    slots = np.clip(slots, np.repeat(starts, per_patch), np.repeat(ends - 1, per_patch))
    faces = order[slots]
    if area_samples:
        total = cum[-1]
        extra = np.searchsorted(cum, rng.random(area_samples) * total, side="right")
        faces = np.concatenate([faces, order[np.minimum(extra, len(order) - 1)]])
    tri = np.asarray(mesh.triangles)[faces]
    a, b = rng.random((2, len(faces), 1))
    flip = a + b > 1
    a, b = np.where(flip, 1 - a, a), np.where(flip, 1 - b, b)
    points = tri[:, 0] + a * (tri[:, 1] - tri[:, 0]) + b * (tri[:, 2] - tri[:, 0])
    return points, faces


def _ray_lengths(mesh: Any, origins: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Distance from each origin to the first surface along its direction (inf if none)."""
    out = np.full(len(origins), np.inf)
    if len(origins) == 0:
        return out
    locations, index_ray, _ = mesh.ray.intersects_location(origins, directions, multiple_hits=False)
    if len(index_ray):
        out[index_ray] = np.linalg.norm(locations - origins[index_ray], axis=1)
    return out


def _face_radius(mesh: Any, labels: np.ndarray) -> np.ndarray:
    """Each face's radius of curvature within its patch (inf where it is flat)."""
    radius = np.full(len(mesh.faces), np.inf)
    adj = mesh.face_adjacency
    same = labels[adj[:, 0]] == labels[adj[:, 1]]
    r = np.asarray(mesh.face_adjacency_radius, np.float64)[same]
    r = np.where(np.isfinite(r), r, np.inf)
    for side in (0, 1):
        np.minimum.at(radius, adj[same, side], r)
    return radius


def offsets(mesh: Any, points: np.ndarray, faces: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """`delta` at each point: a share of the gap across the surface there, at least a share of
    its radius of curvature, within `OFFSET_MM`."""
    normals = np.asarray(mesh.face_normals)[faces]
    thick = _ray_lengths(mesh, points - normals * _EPS, -normals)
    gap = _ray_lengths(mesh, points + normals * _EPS, normals)
    local = np.minimum(thick, gap)
    curve = _face_radius(mesh, labels)[faces]
    delta = np.maximum(OFFSET_FRACTION * local, CURVE_FRACTION * curve)
    delta = np.nan_to_num(delta, nan=OFFSET_MM[1], posinf=OFFSET_MM[1])
    clipped: np.ndarray = np.clip(delta, *OFFSET_MM)
    return clipped


def surface_pairs(
    mesh: Any,
    per_patch: int,
    area_samples: int,
    rng: np.random.Generator,
    max_patches: int | None = None,
) -> Pairs:
    """The inside/outside pairs of a closed mesh's surface (see the module docstring)."""
    labels = patch_labels(mesh)
    points, faces = _sample(mesh, labels, per_patch, area_samples, rng, max_patches)
    normals = np.asarray(mesh.face_normals)[faces]
    delta = offsets(mesh, points, faces, labels)[:, None]
    inside, outside = points - normals * delta, points + normals * delta
    keep = np.asarray(mesh.contains(inside), bool) & ~np.asarray(mesh.contains(outside), bool)
    return Pairs(inside[keep], outside[keep], labels[faces][keep], int(labels.max()) + 1)


@dataclass(frozen=True)
class PatchScore:
    overall: float  # share of all points on their side
    worst: float  # the worst patch's score (1.0 when no patch has enough pairs)
    wrong_patches: int  # patches scoring below 1


def score_pairs(pairs: Pairs, other: Any) -> PatchScore:
    """How `other` (a closed mesh) classifies `pairs` taken from another surface."""
    if len(pairs.inside) == 0:
        return PatchScore(1.0, 1.0, 0)
    in_ok = np.asarray(other.contains(pairs.inside), bool)
    out_ok = ~np.asarray(other.contains(pairs.outside), bool)
    overall = float(np.concatenate([in_ok, out_ok]).mean())
    ids, patch = np.unique(pairs.patch, return_inverse=True)
    count = np.bincount(patch, minlength=len(ids)).astype(np.float64)
    in_share = np.bincount(patch, in_ok, minlength=len(ids)) / count
    out_share = np.bincount(patch, out_ok, minlength=len(ids)) / count
    score = np.minimum(in_share, out_share)[count >= MIN_PAIRS]
    if len(score) == 0:
        return PatchScore(overall, 1.0, 0)
    return PatchScore(overall, float(score.min()), int((score < 1.0).sum()))
