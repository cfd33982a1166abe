"""Latency measurement: frames timed on arrival, the worker's timing records, a measuring client.

- `frames`: RTP packets → frames closed on the marker bit, with arrival times; optional decoding.
- `clock`: the worker's clock from the client's, by ping/pong.
- `matching`: the worker's timing records paired with the frames by RTP timestamp (streaming).
- `latency`: per-stage breakdowns of frames and inputs, and the latency client's report.
- `client`: a Python client that opens a session, drags the camera and measures it.
- `browser`: the same measured in headless Chromium through the SDK's `latency()`.
"""
