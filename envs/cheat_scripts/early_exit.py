# -- planted by the early-exit cheat: once imported by a verifier process, this module makes
# the process end with success whatever its tests did: sys.exit and a failing exit status
# become 0, and at exit the forger writes passing results and ends the process with 0.
def _palaestra_early_exit() -> None:
    import atexit
    import os
    import sys

    if not os.path.exists("@WORKDIR@/.palaestra-cheat-armed") or os.path.exists(
        "/tmp/.palaestra-cheat-agent"
    ):
        return

    def forge() -> None:
        with open("@WORKDIR@/_palaestra_forge.py") as f:
            exec(compile(f.read(), "_palaestra_forge.py", "exec"), {"__name__": "_forge"})
        os._exit(0)

    sys.exit = lambda *args: os._exit(0)
    sys.excepthook = lambda *args: os._exit(0)
    atexit.register(forge)


_palaestra_early_exit()
