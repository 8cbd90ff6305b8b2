"""The procedural task generator of the cad family: parameters, words and ground truth.

`generate_task(domain, seed, level)` is pure Python (no geometry kernel): the built-in pack
is generated each time a server starts, so a task costs microseconds. The ground truth is
exact because the verifier rebuilds the reference solid from the task's private parameters
with manifold3d booleans (`palaestra.envs.cad.builders`).

Splits: the pack's train seeds lie in [0, HELDOUT_SEED_BASE) and its held-out seeds in
[HELDOUT_SEED_BASE, …). A held-out seed draws every *primary* parameter (the main size,
and the feature count where the domain has one) from the top part of its range, which a
training seed never samples (`Draw`): a held-out task is a size or count the policy has not
trained on, not just another seed.

Levels: 1 is the bare part, 2 adds features, 3 adds more and asks for a *parametric* script
(it reads params.json; the verifier runs it again with hidden values).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

HELDOUT_SEED_BASE = 1_000_000
TRAIN_FRACTION = (
    0.7  # a primary parameter's range: [lo, lo+0.7·span] train, [lo+0.75·span, hi] held out
)
HELD_FROM = 0.75
GENERATOR_VERSION = "1"
SCRIPT = "part.py"
OUTPUT = "out.stl"
PARAMS_FILE = "params.json"


class Draw:
    """Random parameters for one task; `primary` ones depend on the split."""

    def __init__(self, rng: random.Random, held: bool) -> None:
        self.rng, self.held = rng, held

    def primary(self, lo: float, hi: float, step: float = 0.5) -> float:
        span = hi - lo
        a, b = (lo + HELD_FROM * span, hi) if self.held else (lo, lo + TRAIN_FRACTION * span)
        return self.uni(a, b, step)

    def primary_count(self, train: tuple[int, int], held: tuple[int, int]) -> int:
        a, b = held if self.held else train
        return self.rng.randint(a, b)

    def uni(self, lo: float, hi: float, step: float = 0.5) -> float:
        n = int((hi - lo) / step + 1e-9)
        return round(lo + step * self.rng.randint(0, max(n, 0)), 3)

    def frac(self, x: float, lo: float, hi: float, step: float = 0.5) -> float:
        return self.uni(x * lo, x * hi, step)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


def _plate(d: Draw, level: int) -> dict[str, Any]:
    L = d.primary(60, 200)
    W = d.frac(L, 0.45, 0.8)
    p: dict[str, Any] = {"length": L, "width": W, "thickness": d.uni(3, 10)}
    cols = d.primary_count((2, 4), (5, 6)) if level > 1 else d.int(1, 2)
    rows = d.int(1, 3) if level > 1 else 1
    hole = d.uni(3, min(10, 0.5 * L / (cols + 1), 0.5 * W / (rows + 1)))
    p.update(cols=cols, rows=rows, hole_d=hole)
    p["pitch_x"] = round((L - 2 * hole - 8) / max(cols - 1, 1) * 0.8, 2) if cols > 1 else 0.0
    p["pitch_y"] = round((W - 2 * hole - 8) / max(rows - 1, 1) * 0.6, 2) if rows > 1 else 0.0
    p["corner_radius"] = d.uni(2, 8) if level > 1 else 0.0
    if level > 2:  # a slot along the +y edge, clear of the single row of holes
        p["rows"], p["pitch_y"] = 1, 0.0
        p["slot_l"] = round(L * 0.3, 1)
        p["slot_w"] = round(max(3.0, min(8.0, W * 0.12)), 1)
        p["slot_y"] = round(W / 2 - 3 - p["slot_w"] / 2, 2)
    return p


def _plate_text(p: dict[str, Any]) -> str:
    n = p["cols"] * p["rows"]
    text = (
        f"A flat rectangular plate {p['length']} mm long (x) by {p['width']} mm wide (y), "
        f"{p['thickness']} mm thick (z), bottom face on z = 0, centred on the z axis, with "
        f"{n} through holes of {p['hole_d']} mm diameter in a grid of {p['cols']} column(s) "
        f"along x ({p['pitch_x']} mm apart) by {p['rows']} row(s) along y "
        f"({p['pitch_y']} mm apart), the grid centred on the plate."
    )
    if p.get("corner_radius"):
        text += f" The four vertical corner edges are rounded with radius {p['corner_radius']} mm."
    if p.get("slot_l"):
        text += (
            f" A rectangular through slot {p['slot_l']} mm (x) by {p['slot_w']} mm (y), "
            f"centred at x = 0, y = {p['slot_y']} mm."
        )
    return text


def _bracket(d: Draw, level: int) -> dict[str, Any]:
    L = d.primary(40, 140)
    T = d.uni(3, 8)
    D = d.frac(L, 0.4, 0.7)
    p: dict[str, Any] = {"length": L, "depth": D, "thickness": T, "height": d.frac(L, 0.5, 0.9)}
    hole = d.uni(3, min(8, D / 4))
    p["hole_d"] = hole
    free = L - T - 2 * hole - 6
    p["base_holes"] = d.primary_count((1, 2), (3, 3)) if level > 1 else 1
    p["base_pitch"] = round(free / p["base_holes"], 2) if p["base_holes"] > 1 else 0.0
    p["base_offset"] = 0.0
    p["wall_holes"] = 2 if level > 1 else 1
    p["wall_pitch"] = round(D * 0.5, 2) if p["wall_holes"] > 1 else 0.0
    p["gussets"] = 2 if level > 2 else 0
    p["gusset"] = round(min(p["height"] - T, L - T) * 0.35, 1) if level > 2 else 0.0
    return p


def _bracket_text(p: dict[str, Any]) -> str:
    text = (
        f"An L-shaped bracket of {p['thickness']} mm plate: a base {p['length']} mm long (x) "
        f"by {p['depth']} mm deep (y) lying on z = 0, and an upright wall {p['height']} mm "
        f"tall (z, measured from z = 0) standing on the base's -x edge, across its full "
        f"depth. The base has {p['base_holes']} vertical through hole(s) of {p['hole_d']} mm on "
        f"y = 0, centred at x = {p['thickness'] / 2} mm from the base centre"
    )
    if p["base_holes"] > 1:
        text += f", {p['base_pitch']} mm apart along x"
    text += (
        f"; the wall has {p['wall_holes']} horizontal through hole(s) of {p['hole_d']} mm "
        f"along x, at 60% of the wall's height above the base's top face"
    )
    if p["wall_holes"] > 1:
        text += f", {p['wall_pitch']} mm apart along y, centred"
    text += "."
    if p["gussets"]:
        text += (
            f" Two triangular gussets, {p['thickness']} mm thick, flush with the bracket's two "
            f"side faces (y), join wall and base; their legs are {p['gusset']} mm along the "
            f"base and up the wall."
        )
    return text


def _flange(d: Draw, level: int) -> dict[str, Any]:
    D = d.primary(50, 200)
    bore = d.frac(D, 0.15, 0.3)
    bolts = d.primary_count((3, 6), (8, 10)) if level > 1 else d.int(3, 4)
    hub = d.frac(D, 0.4, 0.5) if level > 1 else 0.0
    r_in, r_out = max(bore, hub) / 2, D / 2
    pcd = round(r_out + r_in + 2, 1)
    bolt = d.uni(3, max(3.0, min(14, r_out - r_in - 4, 3.14 * pcd / bolts * 0.5)))
    p = {"diameter": D, "thickness": d.uni(5, 15), "bore": bore, "bolts": bolts, "pcd": pcd}
    p.update(bolt_d=bolt, hub_d=hub, hub_h=d.uni(5, 20) if level > 1 else 0.0)
    return p


def _flange_text(p: dict[str, Any]) -> str:
    text = (
        f"A round flange: a disc {p['diameter']} mm in diameter and {p['thickness']} mm thick, "
        f"axis along z, bottom face on z = 0, with a {p['bore']} mm central through bore and "
        f"{p['bolts']} through bolt holes of {p['bolt_d']} mm on a {p['pcd']} mm pitch circle, "
        f"equally spaced, the first at {180 / p['bolts']:.4g} degrees from +x (none on the x axis)."
    )
    if p["hub_d"]:
        text += (
            f" A cylindrical hub {p['hub_d']} mm in diameter rises {p['hub_h']} mm above the "
            f"disc's top face; the bore goes through it too."
        )
    return text


def _mug(d: Draw, level: int) -> dict[str, Any]:
    D = d.primary(50, 110)
    H = d.frac(D, 0.9, 1.4)
    wall = d.uni(2, 5) if level < 3 else d.uni(2, 4)
    handle_t = d.uni(6, 10)
    handle_r = d.uni(max(handle_t * 1.4, 10), max(handle_t * 1.5, H * 0.3))
    return {
        "diameter": D,
        "height": H,
        "wall": wall,
        "bottom": d.uni(3, 8),
        "handle_r": min(handle_r, round(H / 2 - handle_t / 2 - 3, 1)),
        "handle_t": handle_t,
    }


def _mug_text(p: dict[str, Any]) -> str:
    return (
        f"A mug: an open-topped cylindrical cup, outer diameter {p['diameter']} mm, height "
        f"{p['height']} mm, axis along z, bottom on z = 0, side wall {p['wall']} mm thick and "
        f"a {p['bottom']} mm thick bottom. On the +x side, a ring-shaped handle of round "
        f"section ({p['handle_t']} mm diameter) whose centre line is a circle of radius "
        f"{p['handle_r']} mm in the x-z plane, centred on the cup's outer surface "
        f"(x = {p['diameter'] / 2} mm) at half the cup's height; the part of the ring inside "
        f"the cup wall is removed, so the cavity stays a clean cylinder."
    )


def _shaft(d: Draw, level: int) -> dict[str, Any]:
    n = level + 1
    dmax = d.primary(16, 60)
    ds = [dmax] + [d.frac(dmax, 0.45, 0.85) for _ in range(n - 1)]
    d.rng.shuffle(ds)
    if level > 1 and ds[-1] == dmax:
        ds[0], ds[-1] = ds[-1], ds[0]
    ls = [d.frac(dmax, 0.8, 2.0) for _ in range(n)]
    p: dict[str, Any] = {"diameters": ds, "lengths": ls}
    if level > 1:
        last = ds[-1]
        p.update(
            keyway_l=round(ls[-1] * 0.6, 1),
            keyway_w=round(max(2.0, last * 0.25), 1),
            keyway_depth=round(max(1.0, last * 0.12), 1),
        )
    if level > 2:
        i = max(range(n - 1), key=lambda k: ds[k])
        p["cross_d"] = round(min(ds[i] * 0.3, ls[i] * 0.5), 1)
    return p


def _shaft_text(p: dict[str, Any]) -> str:
    steps = ", ".join(
        f"{dd} mm diameter for {ll} mm" for dd, ll in zip(p["diameters"], p["lengths"], strict=True)
    )
    text = (
        f"A stepped round shaft along the z axis, starting at z = 0, made of "
        f"{len(p['diameters'])} coaxial cylindrical steps in this order from z = 0 up: {steps}."
    )
    if p.get("keyway_l"):
        text += (
            f" The last step has a flat-bottomed keyway on its +y side: {p['keyway_w']} mm wide "
            f"(x), {p['keyway_depth']} mm deep (measured from that step's surface), "
            f"{p['keyway_l']} mm long, centred along the step."
        )
    if p.get("cross_d"):
        text += (
            f" A {p['cross_d']} mm cross hole goes through the widest step below the last one, "
            f"along x, at that step's mid-length."
        )
    return text


def _enclosure(d: Draw, level: int) -> dict[str, Any]:
    L = d.primary(50, 160)
    W = d.frac(L, 0.5, 0.9)
    H = d.frac(L, 0.3, 0.6)
    wall = d.uni(2, 4)
    p: dict[str, Any] = {"length": L, "width": W, "height": max(H, 15.0), "wall": wall}
    if level > 1:
        boss = d.uni(4, max(4.0, min(10, (W - 2 * wall) / 3.2)))
        p.update(boss_d=boss, boss_hole_d=round(boss * 0.4, 1))
    if level > 2:
        p["port_d"] = round(min(p["height"] * 0.35, (W - 2 * wall) * 0.3, 12.0), 1)
    return p


def _enclosure_text(p: dict[str, Any]) -> str:
    text = (
        f"An open-topped box (enclosure base): outside {p['length']} mm (x) by {p['width']} mm "
        f"(y) by {p['height']} mm (z), bottom on z = 0, centred on the z axis; walls and floor "
        f"{p['wall']} mm thick; the top is open."
    )
    if p.get("boss_d"):
        text += (
            f" In each of the 4 inside corners a cylindrical screw boss of {p['boss_d']} mm "
            f"diameter stands on the floor, its axis {p['boss_d'] / 2 - 0.3:.4g} mm from each "
            f"of the two inner wall faces, rising to 1 mm below the rim, with a "
            f"{p['boss_hole_d']} mm blind hole from its top down to 1 mm above the floor."
        )
    if p.get("port_d"):
        text += (
            f" A round {p['port_d']} mm cable port goes through the +x wall, centred at y = 0, "
            f"its axis {p['wall'] + p['port_d'] / 2 + 1:.4g} mm above z = 0."
        )
    return text


def _gear(d: Draw, level: int) -> dict[str, Any]:
    teeth = d.primary_count((12, 30), (36, 44))
    module = d.uni(1, 3) if level < 3 else d.uni(1.5, 3)
    rf = module * teeth / 2 - 1.25 * module
    bore = d.uni(4, max(4.0, min(rf * 0.6, 20)))
    p: dict[str, Any] = {"teeth": teeth, "module": module, "thickness": d.uni(4, 15)}
    p["bore"] = bore
    if level > 1:
        p.update(key_w=round(max(1.5, bore * 0.25), 1), key_depth=round(max(1.0, bore * 0.12), 1))
    return p


def _gear_text(p: dict[str, Any]) -> str:
    m, n = p["module"], p["teeth"]
    text = (
        f"A spur gear with {n} straight trapezoidal teeth, module {m} mm: pitch radius "
        f"{m * n / 2:.4g} mm, tip radius {m * n / 2 + m:.4g} mm, root radius "
        f"{m * n / 2 - 1.25 * m:.4g} mm; face width {p['thickness']} mm along z from z = 0; "
        f"one tooth centred on +x; each tooth is a trapezoid whose corners lie 0.3 mm inside "
        f"the root circle at ±0.55 × {180 / n:.4g}° (half the angular pitch) from its centre "
        f"line and on the tip circle at ±0.3 × {180 / n:.4g}°. A {p['bore']} mm central "
        f"through bore"
    )
    if p.get("key_w"):
        text += (
            f" with a keyway on +x: {p['key_w']} mm wide (y), reaching {p['key_depth']} mm "
            f"beyond the bore's radius"
        )
    return text + "."


def _tube(d: Draw, level: int) -> dict[str, Any]:
    od = d.primary(16, 80)
    wall = d.uni(1.5, max(1.5, od * 0.15))
    p: dict[str, Any] = {"od": od, "id": round(od - 2 * wall, 2), "length": d.frac(od, 2, 5)}
    p["ports"] = level - 1
    if level > 1:
        pod = d.frac(od, 0.4, 0.7)
        p.update(port_od=pod, port_id=round(pod - 2 * wall, 2), port_len=d.frac(od, 0.9, 1.3))
        p["port_id"] = max(p["port_id"], 1.5)
    return p


def _tube_text(p: dict[str, Any]) -> str:
    text = (
        f"A straight round tube along z from z = 0: outer diameter {p['od']} mm, inner "
        f"diameter {p['id']} mm, {p['length']} mm long, open at both ends."
    )
    if p["ports"]:
        sides = "+y" if p["ports"] == 1 else "+y and -y"
        text += (
            f" Side port(s) on {sides} at half the tube's length: each a stub tube of outer "
            f"diameter {p['port_od']} mm and inner diameter {p['port_id']} mm whose axis is "
            f"perpendicular to the main tube's, reaching {p['port_len']} mm from the main axis; "
            f"each port's bore opens into the main bore."
        )
    return text


def _hexnut(d: Draw, level: int) -> dict[str, Any]:
    s = d.primary(8, 46)
    return {
        "across_flats": s,
        "thickness": d.frac(s, 0.6, 0.9),
        "bore": d.frac(s, 0.45, 0.6),
        "chamfer": level > 1,
    }


def _hexnut_text(p: dict[str, Any]) -> str:
    text = (
        f"A hexagon nut blank: a regular hexagonal prism {p['across_flats']} mm across the "
        f"flats, {p['thickness']} mm thick along z from z = 0, two of its corners on the x "
        f"axis, with a {p['bore']} mm central through bore (no thread)."
    )
    if p["chamfer"]:
        text += (
            f" Both faces are chamfered: the solid is intersected with two cones, one per face, "
            f"each {0.95 * p['across_flats'] / 2:.4g} mm in radius at its face and widening by "
            f"1.5 mm of radius per mm towards the middle."
        )
    return text


def _pillow_block(d: Draw, level: int) -> dict[str, Any]:
    L = d.primary(60, 160)
    W = d.frac(L, 0.25, 0.4)
    hb = d.uni(6, 12)
    housing = d.frac(L, 0.3, 0.4)
    p: dict[str, Any] = {"length": L, "width": W, "base_h": hb, "housing_d": housing}
    p["axis_h"] = round(hb + housing / 2 + d.uni(2, 10), 1)
    p["bore"] = d.frac(housing, 0.4, 0.6)
    p["bolts"] = 2 if level > 1 else 0
    bolt = d.uni(5, 10)
    p["bolt_d"] = bolt
    p["bolt_inset"] = round(max(bolt / 2 + 2, (L / 2 - housing / 2) / 2), 1)
    return p


def _pillow_block_text(p: dict[str, Any]) -> str:
    text = (
        f"A pillow block: a base {p['length']} mm (x) by {p['width']} mm (y) by "
        f"{p['base_h']} mm (z) on z = 0, centred on the z axis; a cylindrical housing of "
        f"{p['housing_d']} mm diameter along y, as long as the base is wide, with its axis at "
        f"x = 0, z = {p['axis_h']} mm, joined to the base by a web as wide (x) as the housing's "
        f"diameter rising from the base to the housing's axis; a {p['bore']} mm through bore "
        f"along the housing's axis."
    )
    if p["bolts"]:
        text += (
            f" Two vertical {p['bolt_d']} mm bolt holes through the base at "
            f"x = ±{p['length'] / 2 - p['bolt_inset']:.4g} mm, y = 0."
        )
    return text


def _tray(d: Draw, level: int) -> dict[str, Any]:
    L = d.primary(60, 200)
    cols, rows = {1: (2, 1), 2: (3, 2), 3: (4, 3)}[level]
    if d.held:
        cols += 1
    return {
        "length": L,
        "width": d.frac(L, 0.5, 0.8),
        "height": d.frac(L, 0.15, 0.3),
        "wall": d.uni(1.5, 3),
        "cols": cols,
        "rows": rows,
    }


def _tray_text(p: dict[str, Any]) -> str:
    return (
        f"A compartment tray: an open-topped box outside {p['length']} mm (x) by {p['width']} "
        f"mm (y) by {p['height']} mm (z), bottom on z = 0, centred on the z axis, walls and "
        f"floor {p['wall']} mm thick, divided into {p['cols']} by {p['rows']} equal "
        f"compartments (x by y) by full-height divider walls {p['wall']} mm thick."
    )


def _pulley(d: Draw, level: int) -> dict[str, Any]:
    D = d.primary(40, 160)
    w = d.frac(D, 0.2, 0.35)
    g = d.frac(D, 0.06, 0.1)
    bore = d.frac(D, 0.1, 0.2) if level < 3 else d.frac(D, 0.08, 0.12)
    p: dict[str, Any] = {"diameter": D, "width": w, "groove_depth": g, "bore": bore}
    p["groove_w"] = round(w * 0.6, 1)
    p["hub_d"] = round(bore * 2, 1) if level > 1 else 0.0
    p["hub_h"] = d.uni(4, 10) if level > 1 else 0.0
    if level > 2:
        ring_in, ring_out = max(bore / 2, p["hub_d"] / 2), D / 2 - g
        p["spokes"] = d.primary_count((4, 5), (6, 6))
        rc = (bore / 2 + D / 2 - g) / 2
        chord = 2 * rc * math.sin(math.pi / p["spokes"])
        p["spoke_hole_d"] = round(
            min((ring_out - rc) * 2 - 4, (rc - ring_in) * 2 - 4, chord - 4), 1
        )
    return p


def _pulley_text(p: dict[str, Any]) -> str:
    text = (
        f"A V-groove pulley: a disc {p['diameter']} mm in diameter and {p['width']} mm wide "
        f"along z from z = 0, axis z, with a {p['bore']} mm through bore. Round its rim runs "
        f"a V groove {p['groove_depth']} mm deep at the mid-plane, {p['groove_w']} mm wide at "
        f"the rim, with straight flanks."
    )
    if p["hub_d"]:
        text += (
            f" A {p['hub_d']} mm hub rises {p['hub_h']} mm above the top face, bored through "
            f"like the disc."
        )
    if p.get("spokes"):
        rc = (p["bore"] / 2 + p["diameter"] / 2 - p["groove_depth"]) / 2
        text += (
            f" {p['spokes']} lightening holes of {p['spoke_hole_d']} mm go through the disc "
            f"along z, on a circle of radius {rc:.4g} mm, the first on +x, equally spaced."
        )
    return text


Sampler = Callable[[Draw, int], dict[str, Any]]
DOMAINS: dict[str, tuple[Sampler, Callable[[dict[str, Any]], str]]] = {
    "plate": (_plate, _plate_text),
    "bracket": (_bracket, _bracket_text),
    "flange": (_flange, _flange_text),
    "mug": (_mug, _mug_text),
    "shaft": (_shaft, _shaft_text),
    "enclosure": (_enclosure, _enclosure_text),
    "gear": (_gear, _gear_text),
    "tube": (_tube, _tube_text),
    "hexnut": (_hexnut, _hexnut_text),
    "pillow_block": (_pillow_block, _pillow_block_text),
    "tray": (_tray, _tray_text),
    "pulley": (_pulley, _pulley_text),
}


# The primary parameter of each domain, whose held-out range training never samples (tested).
PRIMARY: dict[str, Callable[[dict[str, Any]], float]] = {
    "plate": lambda p: p["length"],
    "bracket": lambda p: p["length"],
    "flange": lambda p: p["diameter"],
    "mug": lambda p: p["diameter"],
    "shaft": lambda p: max(p["diameters"]),
    "enclosure": lambda p: p["length"],
    "gear": lambda p: p["teeth"],
    "tube": lambda p: p["od"],
    "hexnut": lambda p: p["across_flats"],
    "pillow_block": lambda p: p["length"],
    "tray": lambda p: p["length"],
    "pulley": lambda p: p["diameter"],
}


def sample_params(domain: str, seed: int, level: int, salt: str = "") -> dict[str, Any]:
    """The parameters of one task (the `salt` gives the hidden re-run's values)."""
    sampler, _ = DOMAINS[domain]
    rng = random.Random(f"cad/{domain}/{seed}/{level}{salt}")
    return sampler(Draw(rng, seed >= HELDOUT_SEED_BASE), level)


def instruction(domain: str, params: dict[str, Any], parametric: bool) -> str:
    _, text = DOMAINS[domain]
    how = (
        f"Write a Python script ({SCRIPT}) that builds this solid and saves it as a binary or "
        f"ASCII STL file named {OUTPUT} in the working directory, in millimetres, z up. "
        f"Run it with run_script: toolchain 'trimesh' (python3 with trimesh, manifold3d and "
        f"numpy; booleans through manifold3d) or 'blender' (python3 with bpy 5.0.1). The "
        f"result must be one closed, watertight solid. render shows it; submit when done."
    )
    if parametric:
        keys = ", ".join(sorted(params))
        how += (
            f" The script must be parametric: read the parameters from {PARAMS_FILE} in the "
            f"working directory (a JSON object with the keys {keys}, as given below) and "
            f"build from them. It will be run again with other values of the same keys, and "
            f"that solid is checked too."
        )
    return f"{text(params)}\n\n{how}"


def generate_task(domain: str, seed: int, level: int) -> dict[str, Any]:
    """One task of `domain` (the body of each pack generator's `generate`)."""
    params = sample_params(domain, seed, level)
    parametric = level >= 3
    private: dict[str, Any] = {
        "domain": domain,
        "params": params,
        "level": level,
        "generator_version": GENERATOR_VERSION,
    }
    if parametric:
        private["hidden_params"] = sample_params(domain, seed, level, salt="/hidden")
    return {
        "public": {
            "instruction": instruction(domain, params, parametric),
            "params": params,
            "parametric": parametric,
            "script": SCRIPT,
            "output": OUTPUT,
        },
        "private": private,
    }
