"""Programs the verifiers run in a sandbox, kept as files and read as data
(`palaestra.sandbox.programs.text(name, package=__name__)`): each runs under a bare
``python3 -I`` (or ``sh``) with nothing of palaestra on its path, so each is self-contained."""
