"""A send-side congestion controller after libwebrtc's GoogCC: sans-IO, fed transport-cc.

`CongestionController` is the facade; the modules are its parts, each one concept of
GoogCC: `inter_arrival` and `trendline` (the delay-gradient detector), `aimd` (the rate
control it drives), `delay_based` (the two together), `throughput` (the acknowledged
bitrate), `loss` (the loss-based bound), `probing` (when to probe, and what a probe measured),
`alr` (the application-limited region), `rtt`, `history` (the sent packets feedback is matched
against). `record` records a controller's inputs and replays them.
"""

from .controller import CongestionController
from .record import ControllerRecorder, controller_from_header, open_recording, replay
from .types import (
    BandwidthUsage,
    CongestionState,
    PacketFeedback,
    ProbeCluster,
    SentPacket,
)

__all__ = [
    "BandwidthUsage",
    "CongestionController",
    "CongestionState",
    "ControllerRecorder",
    "PacketFeedback",
    "ProbeCluster",
    "SentPacket",
    "controller_from_header",
    "open_recording",
    "replay",
]
