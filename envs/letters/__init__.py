"""The `letters` family: name the letter `shift` places after a given one, with hints.

A small verifiable multi-turn family, made for training demos and tests (a tiny model
learns it in minutes on a CPU; see docs/training.md). Each `guess` of a wrong letter
answers a hint, `later` or `earlier` (where the answer lies in the alphabet, from the
guess), until the attempts run out; the right letter ends the episode. `submit` ends it
with a final answer. Reward: 1 for the right letter on the first attempt, halved for
each attempt more (1, 0.5, 0.25, …), 0 when it was never named.
"""

from __future__ import annotations

from palaestra.envs.letters.family import GuessArgs, LettersFamily, SubmitArgs

__all__ = ["GuessArgs", "LettersFamily", "SubmitArgs"]
