"""Run inside a gateway sandbox: GET argv[1] (default the gateway's /v1/models) with urllib
and print the body."""

import sys
import urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:4000/v1/models"
with urllib.request.urlopen(url, timeout=10) as reply:
    print(reply.read().decode())
