"""Run inside a sandbox that declared no internet access: its proxy variables (there should be
none), then a connect to each port in argv on its loopback (nothing should answer)."""

import os
import socket
import sys

print(sorted(k for k in os.environ if "proxy" in k.lower()))
for port in map(int, sys.argv[1:]):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3)
        print("CONNECTED", port)
    except OSError as e:
        print("blocked", port, e)
