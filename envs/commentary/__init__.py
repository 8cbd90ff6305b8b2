"""The `finance-commentary` family: analyst commentary on a generated report, judged by a rubric."""

from palaestra.envs.commentary.family import CommentaryFamily, CommentarySettings

__all__ = ["CommentaryFamily", "CommentarySettings"]
