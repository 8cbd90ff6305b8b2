"""The `cad` family: build a solid part with trimesh/manifold3d or Blender, graded by geometry."""

from palaestra.envs.cad.family import CadFamily

__all__ = ["CadFamily"]
