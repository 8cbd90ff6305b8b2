"""Evaluation (DESIGN §8): a policy over a split, k attempts a task, into a run directory
that survives crashes.

Works against any `AsyncClient`, HTTP or in-process. Seeds are fixed: attempt i of a task
uses seed i. Each attempt is held to limits (steps, tokens, wall time). Outcomes:
- `ok`: verified; the reward counts (a policy that ran out of time or tokens is verified
  as it stands, with `error_class` timeout / token_limit);
- `error`: the policy failed (endpoint unreachable, garbage reply, exception): reward 0,
  counted in the mean, classed by `error_class`;
- `void`: an infrastructure fault (sandbox died, verifier crashed, the server went away
  or restarted): never scored 0, reported apart, and rerun by `palaestra eval resume`.

A run directory holds `manifest.json` (what was run) and `attempts.jsonl` (one line per
finished attempt, appended and fsynced before the next is counted). Resuming runs only the
attempts without a line (and, by default, those that ended void); a later line for the same
(task, attempt) supersedes an earlier one, which stays in the file.
"""
