"""Programs the pack registry runs in a sandbox, kept as files and read as data
(`palaestra.sandbox.programs.text(name, package=__name__)`)."""
