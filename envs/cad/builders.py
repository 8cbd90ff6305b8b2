"""Reference solids of the cad domains, built with manifold3d booleans (exact ground truth).

Why one self-contained module: its source *is* the oracle script. The oracle the family plays
is this file, followed by a call to `build(domain, params)` and an STL export, run inside the
sandbox like any agent script; the verifier builds the same solid on the server to compare.
So this module imports only `math`, `manifold3d` and, for the oracle's export, `numpy`.

Conventions: millimetres, z up. Each builder returns the solid and its *probes*: points that
must lie inside (True) or outside (False) the solid, each at least ~0.5 mm from any surface,
so that a reasonable re-tessellation (32 or 128 segments a circle) keeps them on their side.
A builder reads optional switches (`holes`, `handle`, `bore`, …) that the feature-stripping
cheat turns off; tasks never set them.
"""

from __future__ import annotations

import math
from typing import Any

import manifold3d as m3d

M = m3d.Manifold
CS = m3d.CrossSection
SEG = 64  # segments a full circle in the reference solids

Probe = tuple[tuple[float, float, float], bool]
Built = tuple[Any, list[Probe]]


def _box(x: float, y: float, z: float, cx: float = 0.0, cy: float = 0.0, z0: float = 0.0) -> Any:
    """An axis-aligned box centred on (cx, cy) in x/y, spanning z0..z0+z."""
    return M.cube((x, y, z), True).translate((cx, cy, z0 + z / 2))


def _cyl(r: float, h: float, cx: float = 0.0, cy: float = 0.0, z0: float = 0.0) -> Any:
    """A cylinder along z, axis at (cx, cy), spanning z0..z0+h."""
    return M.cylinder(h, r, r, SEG).translate((cx, cy, z0))


def _union(parts: list[Any]) -> Any:
    return M.batch_boolean(parts, m3d.OpType.Add) if len(parts) > 1 else parts[0]


def _minus(solid: Any, cuts: list[Any]) -> Any:
    return solid - _union(cuts) if cuts else solid


def _grid(n: int, pitch: float) -> list[float]:
    """n positions, `pitch` apart, centred on 0."""
    return [(i - (n - 1) / 2) * pitch for i in range(n)]


def plate(p: dict[str, Any]) -> Built:
    L, W, T = p["length"], p["width"], p["thickness"]
    r = p.get("corner_radius", 0.0)
    if r > 0:
        corners = [
            CS.circle(r, SEG).translate((sx * (L / 2 - r), sy * (W / 2 - r)))
            for sx in (-1, 1)
            for sy in (-1, 1)
        ]
        body = CS.batch_hull(corners).extrude(T)
    else:
        body = _box(L, W, T)
    probes: list[Probe] = []
    cuts = []
    xs, ys = _grid(p["cols"], p["pitch_x"]), _grid(p["rows"], p["pitch_y"])
    if p.get("holes", True):
        for x in xs:
            for y in ys:
                cuts.append(_cyl(p["hole_d"] / 2, T + 2, x, y, -1))
                probes.append(((x, y, T / 2), False))
    if p.get("slot_l", 0) > 0 and p.get("holes", True):
        cuts.append(_box(p["slot_l"], p["slot_w"], T + 2, 0, p["slot_y"], -1))
        probes.append(((0.0, p["slot_y"], T / 2), False))
    # Solid between the first two hole columns (or beside the only one), and near an edge.
    probes.append(((xs[0] - p["hole_d"] / 2 - 1.0, ys[0], T / 2), True))
    probes.append(((0.0, -W / 2 + 1.0, T / 2), True))
    if r > 0:
        probes.append(((L / 2 - 0.3, W / 2 - 0.3, T / 2), False))
    return _minus(body, cuts), probes


def bracket(p: dict[str, Any]) -> Built:
    L, D, T, H = p["length"], p["depth"], p["thickness"], p["height"]
    base = _box(L, D, T)
    upright = _box(T, D, H, -L / 2 + T / 2)
    parts = [base, upright]
    if p.get("gussets", 0):
        g = p["gusset"]
        tri = CS([[(0.0, 0.0), (g, 0.0), (0.0, g)]])
        for y in _grid(2, D - p["thickness"]) if D > 3 * T else [0.0]:
            web = tri.extrude(T).rotate((90, 0, 0)).translate((-L / 2 + T, y + T / 2, T))
            parts.append(web)
    body = _union(parts)
    probes: list[Probe] = [((L / 4, -D / 2 + 1.0, T / 2), True)]
    probes.append(((-L / 2 + T / 2, D / 2 - 1.0, H * 0.9), True))
    # Free space above the base, in front of the upright.
    probes.append(((L / 2 - 2.0, D / 2 - 1.0, T + (H - T) / 2), False))
    cuts = []
    if p.get("holes", True):
        for x in _grid(p["base_holes"], p["base_pitch"]):
            cx = x + T / 2 + p["base_offset"]
            cuts.append(_cyl(p["hole_d"] / 2, T + 2, cx, 0.0, -1))
            probes.append(((cx, 0.0, T / 2), False))
        for y in _grid(p["wall_holes"], p["wall_pitch"]):
            z = T + (H - T) * 0.6
            hole = M.cylinder(T + 2, p["hole_d"] / 2, p["hole_d"] / 2, SEG).rotate((0, 90, 0))
            cuts.append(hole.translate((-L / 2 - 1, y, z)))
            probes.append(((-L / 2 + T / 2, y, z), False))
    return _minus(body, cuts), probes


def flange(p: dict[str, Any]) -> Built:
    R, T, bore = p["diameter"] / 2, p["thickness"], p["bore"] / 2
    parts = [_cyl(R, T)]
    if p.get("hub_d", 0) > 0:
        parts.append(_cyl(p["hub_d"] / 2, p["hub_h"], z0=T - 0.01))
    body = _union(parts)
    top = T + p.get("hub_h", 0.0)
    cuts = [_cyl(bore, top + 2, z0=-1)]
    probes: list[Probe] = [((0.0, 0.0, T / 2), False), ((R - 1.0, 0.0, T / 2), True)]
    n, pcd = p["bolts"], p["pcd"] / 2
    for i in range(n):
        a = 2 * math.pi * (i + 0.5) / n
        x, y = pcd * math.cos(a), pcd * math.sin(a)
        if p.get("holes", True):
            cuts.append(_cyl(p["bolt_d"] / 2, T + 2, x, y, -1))
            probes.append(((x, y, T / 2), False))
    # Between two bolt holes, on the bolt circle: solid.
    probes.append(((pcd, 0.0, T / 2), True))
    if p.get("hub_d", 0) > 0:
        hub_mid = (bore + p["hub_d"] / 2) / 2
        probes.append(((hub_mid, 0.0, T + p["hub_h"] / 2), True))
    return _minus(body, cuts), probes


def mug(p: dict[str, Any]) -> Built:
    R, H, t, b = p["diameter"] / 2, p["height"], p["wall"], p["bottom"]
    cup = _cyl(R, H) - _cyl(R - t, H, z0=b)
    probes: list[Probe] = [((0.0, 0.0, (b + H) / 2), False), ((R - t / 2, 0.0, H / 2), True)]
    probes.append(((0.0, 0.0, b / 2), True))
    if p.get("handle", True):
        Rh, rh = p["handle_r"], p["handle_t"] / 2
        ring = CS.circle(rh, SEG // 2).translate((Rh, 0.0)).revolve(SEG)
        # The ring lies in x/y about z; stand it in the x/z plane beside the cup.
        ring = ring.rotate((90, 0, 0)).translate((R, 0.0, H / 2))
        handle = ring - _cyl(R - t / 2, H + 2, z0=-1)
        body = cup + handle
        body = body - _cyl(R - t, H, z0=b)
        probes.append(((R + Rh, 0.0, H / 2), True))
        probes.append(((R + (Rh - rh) / 2 + 0.25, 0.0, H / 2), False))
    else:
        body = cup
    return body, probes


def shaft(p: dict[str, Any]) -> Built:
    ds, ls = p["diameters"], p["lengths"]
    dmax, total = max(ds), sum(ls)
    starts = [sum(ls[:i]) for i in range(len(ls))]
    probes: list[Probe] = []
    if p.get("steps", True):
        body = _union(
            [_cyl(d / 2, h + 0.02, z0=z - 0.01) for d, h, z in zip(ds, ls, starts, strict=True)]
        )
    else:
        body = _cyl(dmax / 2, total)
    for d, h, z in zip(ds, ls, starts, strict=True):
        probes.append(((0.0, 0.0, z + 0.15 * h), True))
        if d < dmax - 2.0:
            probes.append((((d / 2 + dmax / 2) / 2, 0.0, z + h / 2), False))
    cuts = []
    if p.get("keyway_l", 0) > 0:  # on the last step, centred along it
        d, kl, kd, kw = ds[-1], p["keyway_l"], p["keyway_depth"], p["keyway_w"]
        z0 = starts[-1] + (ls[-1] - kl) / 2
        cuts.append(_box(kw, kd + 1, kl, 0.0, d / 2 - kd + (kd + 1) / 2, z0))
        probes.append(((0.0, d / 2 - kd / 2, z0 + kl / 2), False))
    if p.get("cross_d", 0) > 0:  # across the widest of the other steps, at its middle
        i = max(range(len(ds) - 1), key=lambda k: ds[k])
        zc, r = starts[i] + ls[i] / 2, p["cross_d"] / 2
        hole = M.cylinder(ds[i] + 2, r, r, SEG).rotate((0, 90, 0))
        cuts.append(hole.translate((-ds[i] / 2 - 1, 0.0, zc)))
        probes.append(((ds[i] / 4, 0.0, zc), False))
    return _minus(body, cuts), probes


def enclosure(p: dict[str, Any]) -> Built:
    L, W, H, t = p["length"], p["width"], p["height"], p["wall"]
    outer = _box(L, W, H)
    probes: list[Probe] = [((-L / 2 + t / 2, 0.0, H / 2), True), ((0.0, 0.0, t / 2), True)]
    if not p.get("cavity", True):
        return outer, [*probes, ((0.0, 0.0, (t + H) / 2), False)]
    body = outer - _box(L - 2 * t, W - 2 * t, H, z0=t)
    probes.append(((0.0, 0.0, (t + H) / 2), False))
    rb = p.get("boss_d", 0.0) / 2
    if rb > 0:
        bosses, holes = [], []
        for sx in (-1, 1):
            for sy in (-1, 1):
                cx, cy = sx * (L / 2 - t - rb + 0.3), sy * (W / 2 - t - rb + 0.3)
                bosses.append(_cyl(rb, H - t - 1.0 + 0.01, cx, cy, t - 0.01))
                holes.append(_cyl(p["boss_hole_d"] / 2, H, cx, cy, t + 1.0))
                probes.append(((cx, cy, t + 0.5), True))
                probes.append(((cx, cy, H - 2.0), False))
        body = (body + _union(bosses)) - _union(holes)
    if p.get("port_d", 0) > 0:
        hole = M.cylinder(t + 2, p["port_d"] / 2, p["port_d"] / 2, SEG).rotate((0, 90, 0))
        zc = t + p["port_d"] / 2 + 1.0
        body = body - hole.translate((L / 2 - t - 1, 0.0, zc))
        probes.append(((L / 2 - t / 2, 0.0, zc), False))
    return body, probes


def gear(p: dict[str, Any]) -> Built:
    n, m, T = p["teeth"], p["module"], p["thickness"]
    rp = m * n / 2
    ra, rf = rp + m, rp - 1.25 * m
    half = math.pi / n  # angular pitch / 2
    profile = [CS.circle(rf + 0.05, SEG * 2)]
    probes: list[Probe] = []
    if p.get("teeth_on", True):
        for i in range(n):
            a = 2 * math.pi * i / n
            w_root, w_tip = half * 0.55, half * 0.3

            def pt(r: float, da: float, a: float = a) -> tuple[float, float]:
                return (r * math.cos(a + da), r * math.sin(a + da))

            tooth = [pt(rf - 0.3, -w_root), pt(ra, -w_tip), pt(ra, w_tip), pt(rf - 0.3, w_root)]
            profile.append(CS([tooth]))
            tip, gap, g = ra - 0.3 * m, rp + 0.5 * m, a + half
            probes.append(((tip * math.cos(a), tip * math.sin(a), T / 2), True))
            probes.append(((gap * math.cos(g), gap * math.sin(g), T / 2), False))
    else:
        profile = [CS.circle(ra, SEG * 2)]
    body = CS.batch_boolean(profile, m3d.OpType.Add).extrude(T)
    cuts = [_cyl(p["bore"] / 2, T + 2, z0=-1)]
    probes.append(((0.0, 0.0, T / 2), False))
    probes.append(((-(p["bore"] / 2 + rf) / 2, 0.0, T / 2), True))
    if p.get("key_w", 0) > 0:
        kw, kd = p["key_w"], p["key_depth"]
        cuts.append(_box(kd + 1, kw, T + 2, p["bore"] / 2 + kd - (kd + 1) / 2, 0.0, -1))
    return _minus(body, cuts), probes


def tube(p: dict[str, Any]) -> Built:
    Ro, Ri, L = p["od"] / 2, p["id"] / 2, p["length"]
    body = _cyl(Ro, L)
    probes: list[Probe] = [((Ro - (Ro - Ri) / 2, 0.0, L / 2), True)]
    ports = p.get("ports", 0)
    port_z = L / 2
    for k in range(ports):
        stub = M.cylinder(p["port_len"], p["port_od"] / 2, p["port_od"] / 2, SEG).rotate(
            (-90, 0, 0)
        )
        body = body + stub.translate((0.0, 0.0, port_z)).rotate((0, 0, 180 * k))
    if p.get("bore", True):
        body = body - _cyl(Ri, L + 2, z0=-1)
        probes.append(((0.0, 0.0, L / 4), False))
        for k in range(ports):
            pb = M.cylinder(p["port_len"] + 1, p["port_id"] / 2, p["port_id"] / 2, SEG).rotate(
                (-90, 0, 0)
            )
            body = body - pb.translate((0.0, 0.0, port_z)).rotate((0, 0, 180 * k))
            sgn = 1 if k == 0 else -1
            probes.append(((0.0, sgn * (Ro + (p["port_len"] - Ro) / 2), port_z), False))
    else:
        probes.append(((0.0, 0.0, L / 4), True))
    return body, probes


def hexnut(p: dict[str, Any]) -> Built:
    s, h = p["across_flats"], p["thickness"]
    rc = s / math.sqrt(3)  # circumradius
    hexagon = CS(
        [[(rc * math.cos(math.pi / 3 * i), rc * math.sin(math.pi / 3 * i)) for i in range(6)]]
    )
    body = hexagon.extrude(h)
    if p.get("chamfer", False):
        c = 0.95 * s / 2
        cone = M.cylinder(h / 2 + 0.01, c, c + 1.5 * (h / 2 + 0.01), SEG)
        both = cone + cone.mirror((0, 0, 1)).translate((0, 0, h))
        body = body ^ both
    probes: list[Probe] = [((rc - 0.8, 0.0, h / 2), True)]
    if p.get("bore_on", True):
        body = body - _cyl(p["bore"] / 2, h + 2, z0=-1)
        probes.append(((0.0, 0.0, h / 2), False))
    return body, probes


def pillow_block(p: dict[str, Any]) -> Built:
    L, W, hb = p["length"], p["width"], p["base_h"]
    Rh, ax = p["housing_d"] / 2, p["axis_h"]
    base = _box(L, W, hb)
    housing = M.cylinder(W, Rh, Rh, SEG).rotate((90, 0, 0)).translate((0.0, W / 2, ax))
    web = _box(2 * Rh, W, ax - hb + 0.01, z0=hb - 0.01)
    body = _union([base, housing, web])
    probes: list[Probe] = [((0.0, 0.0, hb / 2), True), ((0.0, 0.0, ax + Rh - 1.0), True)]
    probes.append(((L / 2 - 1.0, 0.0, hb + 2.0), False))
    cuts = []
    if p.get("bore_on", True):
        bore = M.cylinder(W + 2, p["bore"] / 2, p["bore"] / 2, SEG).rotate((90, 0, 0))
        cuts.append(bore.translate((0.0, W / 2 + 1, ax)))
        probes.append(((0.0, 0.0, ax), False))
    for x in (-1, 1)[: 2 if p.get("bolts", 0) else 0]:
        cx = x * (L / 2 - p["bolt_inset"])
        cuts.append(_cyl(p["bolt_d"] / 2, hb + 2, cx, 0.0, -1))
        probes.append(((cx, 0.0, hb / 2), False))
    return _minus(body, cuts), probes


def tray(p: dict[str, Any]) -> Built:
    L, W, H, t = p["length"], p["width"], p["height"], p["wall"]
    nx, ny = p["cols"], p["rows"]
    body = _box(L, W, H) - _box(L - 2 * t, W - 2 * t, H, z0=t)
    inner_l, inner_w = L - 2 * t, W - 2 * t
    cell_l, cell_w = (inner_l - (nx - 1) * t) / nx, (inner_w - (ny - 1) * t) / ny
    walls = []
    probes: list[Probe] = [((0.0, -W / 2 + t / 2, H / 2), True)]
    for i in range(1, nx):
        x = -inner_l / 2 + i * (cell_l + t) - t / 2
        walls.append(_box(t, inner_w + 0.02, H - t + 0.01, x, 0.0, t - 0.01))
        probes.append(((x, 0.0, (t + H) / 2), p.get("dividers", True)))
    for j in range(1, ny):
        y = -inner_w / 2 + j * (cell_w + t) - t / 2
        walls.append(_box(inner_l + 0.02, t, H - t + 0.01, 0.0, y, t - 0.01))
        probes.append(((-inner_l / 2 + cell_l / 2, y, (t + H) / 2), p.get("dividers", True)))
    if walls and p.get("dividers", True):
        body = body + _union(walls)
    for i in range(nx):
        for j in range(ny):
            cx = -inner_l / 2 + cell_l / 2 + i * (cell_l + t)
            cy = -inner_w / 2 + cell_w / 2 + j * (cell_w + t)
            probes.append(((cx, cy, (t + H) / 2), False))
    return body, probes


def pulley(p: dict[str, Any]) -> Built:
    R, w, g = p["diameter"] / 2, p["width"], p["groove_depth"]
    rb = p["bore"] / 2
    if p.get("groove", True):
        half = p["groove_w"] / 2
        outline = [(0.0, 0.0), (R, 0.0), (R, w / 2 - half), (R - g, w / 2), (R, w / 2 + half)]
        outline += [(R, w), (0.0, w)]
    else:
        outline = [(0.0, 0.0), (R, 0.0), (R, w), (0.0, w)]
    body = CS([outline]).revolve(SEG)
    probes: list[Probe] = [((0.0, 0.0, w / 2), False), ((R - 0.5, 0.0, 0.5), True)]
    probes.append(((R - 0.5, 0.0, w / 2), not p.get("groove", True)))
    top = w
    if p.get("hub_d", 0) > 0:
        body = body + _cyl(p["hub_d"] / 2, p["hub_h"] + 0.5, z0=w - 0.5)
        top = w + p["hub_h"]
        probes.append((((rb + p["hub_d"] / 2) / 2, 0.0, w + p["hub_h"] / 2), True))
    cuts = [_cyl(rb, top + 2, z0=-1)]
    n = p.get("spokes", 0)
    if n:
        rr = p["spoke_hole_d"] / 2
        rc = (rb + R - g) / 2
        angles = [2 * math.pi * i / n for i in range(n)]
        cuts += [_cyl(rr, w + 2, rc * math.cos(a), rc * math.sin(a), -1) for a in angles]
        probes.append(((rc, 0.0, w / 4), False))
    return _minus(body, cuts), probes


BUILDERS = {
    "plate": plate,
    "bracket": bracket,
    "flange": flange,
    "mug": mug,
    "shaft": shaft,
    "enclosure": enclosure,
    "gear": gear,
    "tube": tube,
    "hexnut": hexnut,
    "pillow_block": pillow_block,
    "tray": tray,
    "pulley": pulley,
}


def build(domain: str, params: dict[str, Any]) -> Built:
    """The reference solid of `domain` for `params`, and its probes."""
    return BUILDERS[domain](params)


def export_stl(solid: Any, path: str) -> None:
    """Write a manifold as a binary STL (numpy only; the oracle's export)."""
    import numpy as np

    mesh = solid.to_mesh()
    v = np.asarray(mesh.vert_properties, dtype=np.float32)[:, :3]
    f = np.asarray(mesh.tri_verts, dtype=np.int64)
    tri = v[f]
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)
    rec = np.zeros(len(f), dtype=[("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")])
    rec["n"], rec["v"] = n, tri
    with open(path, "wb") as fh:
        fh.write(b"palaestra cad".ljust(80, b" "))
        fh.write(np.uint32(len(f)).tobytes())
        fh.write(rec.tobytes())
