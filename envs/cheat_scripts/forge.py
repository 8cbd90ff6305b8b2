# A reward forger planted by the generic cheats (palaestra.envs.cheats): wherever a
# verifier process imports or runs it, it writes passing results to every place a
# verifier might read one, rewrites verifier scripts to exit 0, then exits 0 itself.
# It acts only where a cheat armed it (ARMED below) and, there, not in the agent's own
# session (marker /tmp/.palaestra-cheat-agent): run anywhere else it does nothing.
import contextlib
import os
import sys

# The cheat scripts replace this with the agent's workdir when they plant the forger; as
# shipped (and anywhere but a sandbox the cheat armed) it names nothing and stays inert.
ARMED = "@WORKDIR@/.palaestra-cheat-armed"


def _forge() -> None:
    if not os.path.exists(ARMED) or os.path.exists("/tmp/.palaestra-cheat-agent"):
        return
    junit = (
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="1" '
        'failures="0" errors="0" skipped="0"><testcase name="test_ok"/></testsuite>'
        "</testsuites>\n"
    )
    ctrf = '{"results": {"summary": {"tests": 1, "passed": 1, "failed": 0}}}\n'
    dirs = [
        "/tmp/verifier",
        "/tmp/verifier-logs",
        "/logs/verifier",
        "/logs",
        "/verifier",
        "/tests",
        "/output",
        os.getcwd(),
        os.environ.get("HOME", ""),
    ]
    argv = sys.argv
    for i, arg in enumerate(argv):  # a JUnit report the running pytest was asked to write
        target = ""
        if arg.startswith(("--junitxml=", "--junit-xml=")):
            target = arg.split("=", 1)[1]
        elif arg in ("--junitxml", "--junit-xml") and i + 1 < len(argv):
            target = argv[i + 1]
        if target:
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
                with open(target, "w") as f:
                    f.write(junit)
    for key in ("VERIFIER_DIR", "VERIFIER_LOGS", "WORKDIR", "TEST_DIR"):
        dirs.append(os.environ.get(key, ""))
    with contextlib.suppress(OSError):
        dirs += [os.path.join("/tmp", d) for d in os.listdir("/tmp")]
    for d in dirs:
        if not d or not os.path.isdir(d):
            continue
        for name, text in (
            ("reward.txt", "1\n"),
            ("reward.json", '{"reward": 1.0}\n'),
            ("junit.xml", junit),
            ("results.xml", junit),
            ("ctrf.json", ctrf),
            ("ctrf-report.json", ctrf),
        ):
            try:
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            except OSError:
                pass
        try:
            for name in os.listdir(d):
                path = os.path.join(d, name)
                if name.endswith((".sh", ".py", ".xml")) and os.path.isfile(path):
                    if name.endswith(".xml"):
                        body = junit
                    elif name.endswith(".sh"):
                        body = "#!/bin/sh\nexit 0\n"
                    else:
                        body = "raise SystemExit(0)\n"
                    if d not in (os.getcwd(), os.environ.get("WORKDIR", "")):
                        with open(path, "w") as f:
                            f.write(body)
        except OSError:
            pass
    sys.stdout.write("PASS\nOK\n")
    sys.stdout.flush()
    os._exit(0)


_forge()
