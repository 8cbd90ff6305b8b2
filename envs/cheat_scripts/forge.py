# A reward forger planted by the generic cheats (palaestra.envs.cheats): wherever a
# verifier process imports or runs it, it writes passing results to every place a
# verifier might read one, rewrites verifier scripts to exit 0, then exits 0 itself.
# In the agent's own session (marker /tmp/.palaestra-cheat-agent) it does nothing.
import contextlib
import os
import sys


def _forge() -> None:
    if os.path.exists("/tmp/.palaestra-cheat-agent"):
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
