"""One browser's stream, on the worker.

- `session`: the peer connection's life: offer and answer, ICE, the deadlines, the close.
- `input_channel`: the `input` data channel: input → camera, quality, keyframes, commands.
- `monitor`: the session's figures (/metrics, timing records) and its frame-rate `governor`.
- `pipeline`: camera → picture (`pictures`) → encoded frame, on the session's thread;
  `keyframes` spaces the keyframes it is asked for.
- `controls` (input events → camera), `scene_commands`, `quality`: what the channel asks for.
"""
