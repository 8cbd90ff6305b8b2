"""A software renderer for the `render` tool: four fixed views of a mesh in one PNG.

No display and no OpenGL on a server: each view is ray cast, one orthographic ray a pixel,
through trimesh's ray interface (embreex, so 4 × 65,536 rays take tens of milliseconds);
the first triangle hit gives the pixel, flat-shaded by the angle to the viewer and darker
with depth, so pockets and cavities show even in the straight views.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

TILE = 256
MARGIN = 12
# (label, direction the camera looks along, up vector): z is up in every view but the top one.
VIEWS: tuple[tuple[str, tuple[float, float, float], tuple[float, float, float]], ...] = (
    ("iso", (-1.0, 1.0, -0.8), (0.0, 0.0, 1.0)),
    ("front (-y)", (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    ("right (+x)", (-1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    ("top (+z)", (0.0, 0.0, -1.0), (0.0, 1.0, 0.0)),
)
MAX_FACES = 2_000_000
BACKGROUND = (250, 250, 250)
TINT = np.array([1.0, 0.9, 0.75])


def _basis(
    look: tuple[float, float, float], up: tuple[float, float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = np.asarray(look, dtype=np.float64)
    d /= np.linalg.norm(d)
    right = np.cross(d, np.asarray(up, dtype=np.float64))
    right /= np.linalg.norm(right)
    return right, np.cross(right, d), d


def _first_hits(mesh: Any) -> Any:
    """A function (origins, directions) -> (ray index, triangle index, distance) of first hits:
    embreex directly when it is there (a third of trimesh's per-call overhead), else trimesh."""
    try:
        from embreex import mesh_construction, rtcore_scene
    except ImportError:  # pragma: no cover - the cad extra installs embreex
        mesh_construction = rtcore_scene = None
    if rtcore_scene is not None:
        scene = rtcore_scene.EmbreeScene()
        mesh_construction.TriangleMesh(scene, np.asarray(mesh.triangles, dtype=np.float32))

        def embree(origins: np.ndarray, directions: np.ndarray) -> tuple[Any, Any, Any]:
            out = scene.run(origins.astype(np.float32), directions.astype(np.float32), output=1)
            tri = np.asarray(out["primID"], dtype=np.int64)
            rays = np.nonzero(tri >= 0)[0]
            return rays, tri[rays], np.asarray(out["tfar"], dtype=np.float64)[rays]

        return embree

    def fallback(origins: np.ndarray, directions: np.ndarray) -> tuple[Any, Any, Any]:
        loc, rays, tri = mesh.ray.intersects_location(origins, directions, multiple_hits=False)
        return rays, tri, np.linalg.norm(loc - origins[rays], axis=1)

    return fallback


def _tile(mesh: Any, hits: Any, view: Any) -> Any:
    from PIL import Image, ImageDraw

    label, look, up = view
    right, upv, d = _basis(look, up)
    vertices = np.asarray(mesh.vertices, dtype=np.float64)
    center = (vertices.max(axis=0) + vertices.min(axis=0)) / 2
    pts = vertices - center
    x, y, depth = pts @ right, pts @ upv, pts @ d
    span = max(float(np.ptp(x)), float(np.ptp(y)), 1e-9)
    scale = (TILE - 2 * MARGIN) / span
    pix = (np.arange(TILE) + 0.5 - TILE / 2) / scale
    u, v = np.meshgrid(pix, -pix)  # rows run down the image: y decreases
    back = float(-depth.min()) + 1.0
    origins = (center - d * back) + u.reshape(-1, 1) * right + v.reshape(-1, 1) * upv
    rays, tri, dist = hits(origins, np.broadcast_to(d, origins.shape).copy())
    image = np.empty((TILE * TILE, 3), dtype=np.float64)
    image[:] = BACKGROUND
    shade = np.abs(np.asarray(mesh.face_normals, dtype=np.float64)[tri] @ d)  # open meshes too
    near = 1.0 - 0.4 * (dist - back - float(depth.min())) / max(float(np.ptp(depth)), 1e-9)
    image[rays] = (40 + 190 * shade * np.clip(near, 0.6, 1.0))[:, None] * TINT
    img = Image.fromarray(image.reshape(TILE, TILE, 3).astype(np.uint8), "RGB")
    ImageDraw.Draw(img).text((4, 2), label, fill=(40, 40, 40))
    return img


def render_png(mesh: Any) -> bytes:
    """Four views (iso, front, right, top) of a trimesh, as PNG bytes."""
    from PIL import Image

    if len(mesh.faces) > MAX_FACES:
        raise ValueError(f"{len(mesh.faces)} triangles: too many to render (max {MAX_FACES})")
    sheet = Image.new("RGB", (2 * TILE, 2 * TILE), (255, 255, 255))
    hits = _first_hits(mesh)
    for k, view in enumerate(VIEWS):
        sheet.paste(_tile(mesh, hits, view), ((k % 2) * TILE, (k // 2) * TILE))
    out = io.BytesIO()
    sheet.save(out, format="PNG", compress_level=3)
    return out.getvalue()


def render_b64(mesh: Any) -> str:
    return base64.b64encode(render_png(mesh)).decode("ascii")
