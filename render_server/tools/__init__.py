"""Clients of a running server, for tests, measurements and load tests (never imported by it).

- `signaling_client`: a Python program's end of the signaling socket (`/ws`).
- `viewer`: a stream decoded by aiortc, for the tests.
- `measure`: latency per stage, from Python or headless Chromium (`render-server latency`).
- `loadtest`: many streams at once and a report (`render-server loadtest`).
- `local_server`: `render-server serve` as a child process; `stats`: percentiles.
"""
