"""The pacing queue: packets leave at the rate in bursts of 5 ms, retransmissions first, and a
queue that waited too long drains faster."""

from __future__ import annotations

from render_server.transport.pacer import BURST_S, MAX_QUEUE_S, PacingQueue

PACKET = 1200


def drain(queue: PacingQueue, start: float, step: float = 0.001) -> list[tuple[float, int]]:
    """(time, size) of every packet as a 1 ms pacer loop lets them out."""
    sent: list[tuple[float, int]] = []
    now = start
    while len(queue):
        sent += [(now, len(p.data)) for p in queue.pop(now)]
        now += step
    return sent


def test_a_keyframe_leaves_at_the_pacing_rate_not_in_one_burst() -> None:
    rate = 8_000_000  # 1 MB/s: 100 packets of 1200 bytes take 120 ms
    queue = PacingQueue(rate)
    for _ in range(100):
        queue.push(bytearray(PACKET), 0.0)
    sent = drain(queue, 0.0)
    assert len(sent) == 100
    duration = sent[-1][0] - sent[0][0]
    assert 0.10 <= duration <= 0.13, duration
    # no 5 ms window carries much more than 5 ms of the rate (one packet of slack)
    for t, _ in sent:
        window = sum(size for s, size in sent if t <= s < t + BURST_S)
        assert window <= rate * BURST_S / 8 + 2 * PACKET


def test_retransmissions_jump_the_queue() -> None:
    queue = PacingQueue(1_000_000)
    for i in range(10):
        queue.push(bytearray([i]) * PACKET, 0.0)
    queue.push(bytearray([99]) * 300, 0.0, retransmission=True)
    first = queue.pop(0.0)
    assert first[0].retransmission and first[0].data[0] == 99


def test_a_queue_near_its_time_limit_drains_faster_than_the_rate() -> None:
    queue = PacingQueue(100_000)  # 12.5 kB/s: 100 packets would take 9.6 s
    for _ in range(100):
        queue.push(bytearray(PACKET), 0.0)
    sent = drain(queue, 0.0)
    assert sent[-1][0] <= MAX_QUEUE_S + 0.05, sent[-1][0]


def test_an_idle_queue_saves_no_more_than_one_burst() -> None:
    queue = PacingQueue(8_000_000)
    queue.push(bytearray(PACKET), 0.0)
    assert len(queue.pop(0.0)) == 1
    for _ in range(50):  # after a second of idling, a frame still leaves paced
        queue.push(bytearray(PACKET), 1.0)
    now_out = len(queue.pop(1.0))
    assert now_out <= int(8_000_000 * BURST_S / 8 / PACKET) + 1, now_out
    wait = queue.wait(1.0)
    assert wait is not None and wait > 0


def test_wait_is_none_when_empty_and_the_delay_counts_the_oldest() -> None:
    queue = PacingQueue(1_000_000)
    assert queue.wait(0.0) is None and queue.queue_delay(0.0) == 0.0
    queue.push(bytearray(PACKET), 1.0)
    queue.push(bytearray(PACKET), 1.5)
    assert queue.queue_delay(2.0) == 1.0
    assert queue.queued_bytes == 2 * PACKET
