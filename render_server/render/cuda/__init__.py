"""The CUDA renderer: the CPU renderer's picture drawn by the kernels in render_server/shaders.

renderer.py        CudaRenderer (and KernelRenderer, what it shares with the emulation)
launch.py          a frame's launch sequence and buffers, over a small Backend interface
kernels.py         the kernel sources, their compile flags and entry points
pycuda_backend.py  the Backend on a GPU, through pycuda (imported only when used)
emulation.py       the same kernels compiled as C++ and run on the host, for tests
dlpack.py          device memory handed to PyAV (and NVENC) without a copy
"""
