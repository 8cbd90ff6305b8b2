"""Policies that act in episodes: oracle, null, an OpenAI-compatible chat model, a local
Hugging Face transformers model, and any Python callable (`module:callable`).

A policy sees the reset response and each step's reply and returns the next action.
The oracle's answers stay on the server: it sends the `oracle` tool and the server
plays the task's reference solution (episodes must be started with `options.oracle`).

Every session counts the tokens it spends in `usage` (prompt and completion), so the
evaluator can hold an attempt to a token budget. `PolicySpec` is the serialisable
description a run stores in its manifest: `palaestra eval resume` rebuilds the same
policy from it (a key is never stored; only the name of the variable that holds it).
"""
