"""Harness mode (DESIGN §9, docs/harness.md): the agent owns the loop.

A harness named at reset (`options["harness"]`, sdk/harness.py) runs inside the episode's
sandbox; its model base URL is the episode's session proxy, reached through the one
listener the sandbox's network namespace holds (127.0.0.1:GATEWAY_PORT,
`SandboxSpec.gateway`). When the harness exits or a limit stops it, the episode is
verified as any other.

- `registry`: the harnesses this server can start (name → install, start, config).
- `proxy`: `SessionProxy` (one per server) and `LlmSession` (one per harness episode):
  forwards OpenAI chat-completions and Anthropic messages calls to the endpoint named at
  reset, records each as an `LlmCall`, enforces the episode's call and token limits.
- `gateway`: the `SocketService` that serves a sandbox's listener for its session.
- `routes`: `/v1/episodes/{id}/llm/…`, the same proxy for a harness outside the sandbox.
- `runner`: starts a harness in an episode, waits for it, ends the episode.
"""
