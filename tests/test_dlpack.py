"""DLPack export of memory we own: read in place by numpy and PyAV, released exactly once."""

from __future__ import annotations

import gc
import threading

import av
import numpy as np
import pytest

from render_server.render.cuda import dlpack
from render_server.render.cuda.dlpack import KDL_CPU, KDL_CUDA, BufferView


def view_of(array: np.ndarray) -> BufferView:
    return BufferView(array.ctypes.data, array.shape, (KDL_CPU, 0), owner=array)


def test_numpy_reads_the_memory_in_place() -> None:
    before = dlpack.live_exports()
    data = np.arange(24, dtype=np.uint8).reshape(4, 6)
    seen = np.from_dlpack(view_of(data))
    assert np.array_equal(seen, data) and seen.shape == (4, 6) and seen.dtype == np.uint8
    data[2, 3] = 200
    assert seen[2, 3] == 200  # the same memory, not a copy
    assert dlpack.live_exports() == before + 1
    del seen
    gc.collect()
    assert dlpack.live_exports() == before  # the consumer's deleter ran


def test_a_capsule_nobody_consumed_releases_its_tensor() -> None:
    before = dlpack.live_exports()
    capsule = view_of(np.zeros((2, 2), np.uint8)).__dlpack__()
    assert dlpack.live_exports() == before + 1
    del capsule
    gc.collect()
    assert dlpack.live_exports() == before


def test_pyav_wraps_nv12_planes_without_a_copy() -> None:
    height, width = 8, 12
    memory = np.zeros(height * width * 3 // 2, np.uint8)
    memory[: height * width] = np.arange(height * width) % 251
    memory[height * width :] = 128
    y = view_of(memory[: height * width].reshape(height, width))
    uv = view_of(memory[height * width :].reshape(height // 2, width))
    frame = av.VideoFrame.from_dlpack((y, uv), format="nv12", width=width, height=height)
    assert (frame.format.name, frame.width, frame.height) == ("nv12", width, height)
    assert frame.planes[0].buffer_ptr == memory.ctypes.data
    assert np.array_equal(frame.to_ndarray().reshape(-1), memory)
    memory[5] = 77
    assert frame.to_ndarray()[0, 5] == 77


def test_the_owner_lives_as_long_as_the_frame() -> None:
    memory = np.full(16 * 16 * 3 // 2, 90, np.uint8)
    y = view_of(memory[: 16 * 16].reshape(16, 16))
    uv = view_of(memory[16 * 16 :].reshape(8, 16))
    frame = av.VideoFrame.from_dlpack((y, uv), format="nv12")
    del memory, y, uv
    gc.collect()
    assert int(frame.to_ndarray()[0, 0]) == 90  # the array is still alive: the frame holds it


def test_frames_released_on_other_threads() -> None:
    before = dlpack.live_exports()
    memory = np.zeros(64 * 64 * 3 // 2, np.uint8)
    y, uv = memory[: 64 * 64].reshape(64, 64), memory[64 * 64 :].reshape(32, 64)
    frames = [
        av.VideoFrame.from_dlpack((view_of(y), view_of(uv)), format="nv12") for _ in range(50)
    ]
    assert dlpack.live_exports() == before + 100

    def drop(chunk: list[av.VideoFrame]) -> None:
        chunk.clear()

    chunks = [frames[i::4] for i in range(4)]
    del frames
    threads = [threading.Thread(target=drop, args=(chunk,)) for chunk in chunks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    assert dlpack.live_exports() == before


def test_what_cannot_be_exported_is_refused() -> None:
    data = np.zeros((2, 2), np.uint8)
    with pytest.raises(BufferError, match="cannot copy"):
        view_of(data).__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not"):
        view_of(data).__dlpack__(dl_device=(KDL_CUDA, 0))
    with pytest.raises(BufferError, match="null"):
        BufferView(0, (2, 2), (KDL_CPU, 0)).__dlpack__()
    assert BufferView(1, (1,), (KDL_CUDA, 3)).__dlpack_device__() == (KDL_CUDA, 3)


def test_rows_wider_than_the_picture() -> None:
    """Planes whose rows are `pitch` bytes apart, as the CUDA renderer lays them out for NVENC."""
    height, width, pitch = 4, 6, 16
    memory = np.zeros(pitch * height * 3 // 2, np.uint8)
    rows = memory.reshape(height * 3 // 2, pitch)
    rows[:height, :width] = np.arange(height * width).reshape(height, width) + 16
    rows[height:, :width] = 128
    rows[:, width:] = 255  # the padding at the end of each row, never part of the picture
    y = BufferView(memory.ctypes.data, (height, width), (KDL_CPU, 0), memory, (pitch, 1))
    assert np.array_equal(np.from_dlpack(y), rows[:height, :width])
    uv_address = memory.ctypes.data + pitch * height
    uv = BufferView(uv_address, (height // 2, width), (KDL_CPU, 0), memory, (pitch, 1))
    frame = av.VideoFrame.from_dlpack((y, uv), format="nv12", width=width, height=height)
    assert frame.planes[0].line_size == pitch
    assert np.array_equal(frame.to_ndarray(), rows[:, :width])
    with pytest.raises(BufferError, match="do not fit"):
        BufferView(memory.ctypes.data, (4, 6), (KDL_CPU, 0), strides=(16,)).__dlpack__()
