"""Latency measurement: frames timed on arrival, the worker's timing records, a measuring client.

- `frames`: RTP packets → frames closed on the marker bit, with arrival times; optional decoding.
- `latency`: clock alignment by ping/pong, records matched with frames, per-stage breakdowns.
- `client`: a Python client that opens a session, drags the camera and measures it.
- `browser`: the same measured in headless Chromium through the SDK's `latency()`.
"""
