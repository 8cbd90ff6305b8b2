"""Serve NeMo Gym's own example resources server (`example_single_tool_call`, shipped in the
`nemo-gym` wheel) on loopback, as its tests build it: a third-party server for
`palaestra conformance --protocol nemo-gym` (tests/server/doors/test_door_nemo_gym.py).

    python nemo_gym_example_server.py PORT
"""

from __future__ import annotations

import sys
from unittest.mock import MagicMock

import uvicorn
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer,
    SimpleWeatherResourcesServerConfig,
)

if __name__ == "__main__":
    port = int(sys.argv[1])
    server = SimpleWeatherResourcesServer(
        config=SimpleWeatherResourcesServerConfig(
            host="127.0.0.1", port=port, entrypoint="", name="weather"
        ),
        server_client=MagicMock(spec=ServerClient),
    )
    uvicorn.run(server.setup_webserver(), host="127.0.0.1", port=port, log_level="warning")
