"""Load tests: many headless WebRTC viewers against a server, and a report of what held.

- `config`: what a run asks for (`LoadTestConfig`).
- `stream`: one stream, a real aiortc peer through the signaling API, counted packet by packet.
- `frame_latency`: its frames' latency, from the worker's timing records (bounded memory).
- `runner`: the streams spread over spawned processes on one clock; progress; the server's count.
- `report`, `html`: per stream and aggregate figures, the verdict, report.json and report.html.
- `progress`: the live display (rich). The command is `render_server.cli.loadtest`.
"""
