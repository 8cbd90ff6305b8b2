"""palaestra/cad generator: the 'mug' domain (parameters, words and ground truth)."""

from palaestra.envs.cad.tasks import generate_task


def generate(seed: int, index: int, level: int) -> dict:
    return generate_task("mug", seed, level)
