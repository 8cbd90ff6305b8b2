"""palaestra: an environment-and-verifier SDK plus a hosted gym server for LLM post-training.

The subpackages live in the repository's top-level folders (DESIGN §2):
``palaestra.sdk`` is ``sdk/``, ``palaestra.server`` is ``server/`` and so on.
"""

__version__ = "0.1.0"
