"""`palaestra eval`: run a policy on a split into a run directory, resume it, report, compare.

    palaestra eval run --pack ORG/NAME@VER --split heldout --policy POLICY -k K --concurrency N
    palaestra eval resume RUN
    palaestra eval report RUN          # regrades from stored trajectories where it can
    palaestra eval compare RUN_A RUN_B
    palaestra eval regrade RUN --pack ORG/NAME@NEWVER [-o NEWRUN]   # from kept final states

`palaestra eval --pack …` (no subcommand) is the first version's form: the same as `run`.
"""
