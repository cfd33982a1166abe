"""aiortc's receive-side bitrate estimator, taken off receivers whose media it never sees.

aiortc gives every video receiver one, with a rate counter of 1,000 one-millisecond buckets:
1,000 objects per peer connection that the garbage collector walks on every full collection
while the connection lives, and again as garbage after it (a peer connection dies in
reference cycles). At 4K60 on this VM a full collection of a few closed sessions took 20-35 ms,
long enough to hold a frame past the 50 ms freeze threshold.

Checked against aiortc 1.16's `RTCRtpReceiver`: `_handle_rtp_packet` skips the estimator
where it is None, as for audio.
"""

from __future__ import annotations

from aiortc import RTCRtpReceiver

ATTRIBUTE = "_RTCRtpReceiver__remote_bitrate_estimator"


def drop_receive_estimator(receiver: RTCRtpReceiver) -> None:
    """No estimator on `receiver`: a send-only session's receiver never gets RTP, and the lean
    harness's receivers read their media before aiortc does."""
    if getattr(receiver, ATTRIBUTE, None) is not None:
        setattr(receiver, ATTRIBUTE, None)
