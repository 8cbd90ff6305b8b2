"""A hostile ACP agent (standard library, raw JSON-RPC on stdio) for the attack tests of
palaestra's ACP client (server/harness/programs/acp_client.py).

`attack`: it answers `initialize` and `session/new`, then during the prompt turn sends the
client every request of `ATTACKS` (reads and writes outside the workspace, through `..`, a
symlink it made, /proc, a FIFO; a terminal whose cwd is outside) and writes each answer to
`attack-answers.json` in its working directory (itself through no ACP request); then it ends
the turn. The other modes break the protocol mid-turn: `garbage` (a line that is not
JSON), `array` (a JSON array), `stray` (a response to no request), `huge` (one line past the
client's limit), `version` (protocol version 99 at initialize), `exit` (it exits mid-turn),
`error` (it answers the prompt with a JSON-RPC error). `flood` is legal but heavy: 20,000
notifications of distinct made-up methods and 1,000 requests sent without waiting, then
the turn ends. `odd` sends `ODD`, requests whose params have odd types or values (a list
for a terminal id, a number for env, a NUL in a command, a signal with no name), and
writes each answer to `odd-answers.json` as `attack` does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "attack"
ATTACKS: list[tuple[str, str, dict[str, Any]]] = [
    ("etc_passwd", "fs/read_text_file", {"path": "/etc/passwd"}),
    ("dotdot", "fs/read_text_file", {"path": "{ws}/../../etc/passwd"}),
    ("relative", "fs/read_text_file", {"path": "inside.txt"}),
    ("symlink_read", "fs/read_text_file", {"path": "{ws}/link-out"}),
    ("symlink_dir_write", "fs/write_text_file", {"path": "{ws}/dir-out/x", "content": "x"}),
    ("symlink_write", "fs/write_text_file", {"path": "{ws}/link-out", "content": "owned"}),
    ("proc_environ", "fs/read_text_file", {"path": "/proc/self/environ"}),
    ("server_files", "fs/read_text_file", {"path": "{server}"}),
    ("write_tmp", "fs/write_text_file", {"path": "/tmp/acp-escape", "content": "x"}),
    ("write_harness", "fs/write_text_file", {"path": "/opt/palaestra/harness/x", "content": "x"}),
    ("fifo", "fs/read_text_file", {"path": "{ws}/fifo"}),
    ("nul", "fs/read_text_file", {"path": "{ws}/a\u0000b"}),
    ("terminal_cwd", "terminal/create", {"command": "pwd", "cwd": "/"}),
    ("not_a_method", "nope/nothing", {}),
    ("params_list", "fs/read_text_file", []),
    ("inside_write", "fs/write_text_file", {"path": "{ws}/inside.txt", "content": "fine"}),
    ("inside_read", "fs/read_text_file", {"path": "{ws}/inside.txt"}),
]

ODD: list[tuple[str, str, dict[str, Any]]] = [
    ("list_id", "terminal/output", {"terminalId": []}),
    ("object_id", "terminal/kill", {"terminalId": {"a": 1}}),
    ("env_number", "terminal/create", {"command": "true", "env": 5}),
    ("env_nul", "terminal/create", {"command": "true", "env": [{"name": "A\u0000", "value": ""}]}),
    ("command_nul", "terminal/create", {"command": "tr\u0000ue"}),
    ("args_nul", "terminal/create", {"command": "echo", "args": ["a\u0000b"]}),
    ("rt_signal", "terminal/create", {"command": "sh", "args": ["-c", "kill -35 $$"]}),
]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def read() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    message: dict[str, Any] = json.loads(line)
    return message


def answer_of(request_id: int) -> dict[str, Any]:
    """The client's answer to our request `request_id` (its own requests do not come here)."""
    while True:
        message = read()
        if message.get("id") == request_id and "method" not in message:
            return message


def fill(value: Any, ws: str, server: str) -> Any:
    if isinstance(value, dict):
        return {k: fill(v, ws, server) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace("{ws}", ws).replace("{server}", server)
    return value


def attack(session_cwd: str) -> None:
    os.symlink("/etc/passwd", os.path.join(session_cwd, "link-out"))
    os.symlink("/tmp", os.path.join(session_cwd, "dir-out"))
    os.mkfifo(os.path.join(session_cwd, "fifo"))
    server = os.environ.get("ACP_SERVER_FILE", "/work/main/pyproject.toml")
    answers = {}
    for k, (name, method, params) in enumerate(ATTACKS, start=1000):
        send({"id": k, "method": method, "params": fill(params, session_cwd, server)})
        answers[name] = answer_of(k)
    with open(os.path.join(session_cwd, "attack-answers.json"), "w") as f:
        json.dump(answers, f)


def odd() -> None:
    """ODD's requests, each answer kept; the signalled terminal is waited on too."""
    answers = {}
    for k, (name, method, params) in enumerate(ODD, start=2000):
        send({"id": k, "method": method, "params": params})
        answers[name] = answer_of(k)
    terminal = answers["rt_signal"].get("result", {}).get("terminalId")
    send({"id": 3000, "method": "terminal/wait_for_exit", "params": {"terminalId": terminal}})
    answers["rt_signal_exit"] = answer_of(3000)
    with open("odd-answers.json", "w") as f:
        json.dump(answers, f)


def main() -> None:
    cwd = os.getcwd()
    while True:
        message = read()
        method, key = message.get("method"), message.get("id")
        if method == "initialize":
            send({"id": key, "result": {"protocolVersion": 99 if MODE == "version" else 1}})
        elif method == "session/new":
            cwd = message["params"]["cwd"]
            send({"id": key, "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            if MODE == "attack":
                attack(cwd)
            elif MODE == "odd":
                odd()
            elif MODE == "garbage":
                sys.stdout.write("this is not json\n")
            elif MODE == "array":
                sys.stdout.write("[1, 2]\n")
            elif MODE == "stray":
                send({"id": 424242, "result": {}})
            elif MODE == "huge":
                sys.stdout.write('{"jsonrpc": "2.0", "method": "x", "params": "' + "a" * (17 << 20))
                sys.stdout.write('"}\n')
            elif MODE == "flood":
                for k in range(20_000):
                    send({"method": f"_made/up{k}", "params": {}})
                for k in range(1_000):
                    send({"id": 5000 + k, "method": "terminal/output", "params": {}})
                for k in range(1_000):
                    answer_of(5000 + k)
            elif MODE == "exit":
                sys.exit(0)
            elif MODE == "error":
                send({"id": key, "error": {"code": -32603, "message": "the agent gave up"}})
                continue
            sys.stdout.flush()
            send({"id": key, "result": {"stopReason": "end_turn"}})


if __name__ == "__main__":
    main()
