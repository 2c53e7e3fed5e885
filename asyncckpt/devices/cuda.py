"""A CUDA GPU through CuPy; torch CUDA tensors are taken through DLPack, sharing memory.

Imported only when a descriptor hands out CuPy arrays or torch CUDA tensors: CuPy is imported
here, torch never (a torch tensor's own module is used, already imported by its owner).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._memory.buffers import PAGE, padded
from .base import Device, Event, Stream

__all__ = ["CupyDevice", "is_cuda_array"]


# base.word_digest on the device: each thread sums the mixed words of a grid-stride loop, warps
# add their threads' sums by shuffles, and one atomic add per warp makes the total (modulo 2**64,
# whatever the order, so the value is exact).
_DIGEST_SOURCE = r"""
__device__ unsigned long long mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void asyncckpt_digest(const unsigned char* data, unsigned long long nbytes,
                                            unsigned long long* out) {
    const unsigned int* words = (const unsigned int*)data;
    unsigned long long whole = nbytes / 4, tail = nbytes % 4, sum = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < whole + (tail ? 1 : 0); i += stride) {
        unsigned long long word = 0;
        if (i < whole) {
            word = words[i];
        } else {
            for (unsigned long long k = 0; k < tail; ++k)
                word |= (unsigned long long)data[4 * whole + k] << (8 * k);
        }
        sum += mix((i << 32) ^ word);
    }
    for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if ((threadIdx.x & 31) == 0)
        atomicAdd(out, sum);
}
"""
_DIGEST_THREADS = 256


def is_cuda_array(array: Any) -> bool:
    """Whether ``array`` is a CuPy array or a torch CUDA tensor (importing neither)."""
    module = type(array).__module__
    if module.startswith("cupy"):
        return True
    return module.startswith("torch") and bool(getattr(array, "is_cuda", False))


class _CupyEvent(Event):
    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def synchronize(self) -> None:
        self.event.synchronize()

    def query(self) -> bool:
        return bool(self.event.done)


class _CupyStream(Stream):
    __slots__ = ("stream", "_cupy")

    def __init__(self, stream: Any, cupy: Any) -> None:
        self.stream = stream
        self._cupy = cupy

    def record(self) -> Event:
        event = self._cupy.cuda.Event()
        event.record(self.stream)
        return _CupyEvent(event)

    def wait_event(self, event: Event) -> None:
        assert isinstance(event, _CupyEvent)
        self.stream.wait_event(event.event)

    def synchronize(self) -> None:
        self.stream.synchronize()


class CupyDevice(Device):
    """The CUDA device that holds the first array of a state.

    Parameters
    ----------
    device_id : int
        The CUDA device.
    torch : module, optional
        The torch module, when the state is made of torch tensors: the user's operators then
        queue their work on torch's current stream, which the runtime orders its copies after.
    """

    def __init__(self, device_id: int = 0, torch: Any = None) -> None:
        import cupy  # the extra "gpu"

        self._cupy = cupy
        self._torch = torch
        self.id = int(device_id)
        self.name = f"cuda:{self.id}"
        self._external: dict[int, _CupyStream] = {}  # torch's streams, by CUDA stream
        self._digest_kernel: Any = None  # built by warm_up()
        self._digest_blocks = 1

    @classmethod
    def of(cls, array: Any) -> "CupyDevice":
        """The device holding ``array`` (a CuPy array or a torch CUDA tensor)."""
        if type(array).__module__.startswith("torch"):
            return cls(array.device.index or 0, torch=sys.modules["torch"])
        return cls(array.device.id)

    def _cuda(self) -> Any:
        return self._cupy.cuda.Device(self.id)

    def owns(self, array: Any) -> bool:
        return (isinstance(array, self._cupy.ndarray) and array.device.id == self.id)

    def adapt(self, arrays: Sequence[Any]) -> list[Any]:
        return [self._cupy.from_dlpack(a) if type(a).__module__.startswith("torch") else a
                for a in arrays]

    def empty(self, nbytes: int) -> Any:
        with self._cuda():
            return self._cupy.zeros(nbytes, dtype=self._cupy.uint8)

    def pinned(self, nbytes: int) -> np.ndarray:
        with self._cuda():
            memory = self._cupy.cuda.alloc_pinned_memory(padded(nbytes) + PAGE)
        raw = np.frombuffer(memory, dtype=np.uint8, count=padded(nbytes) + PAGE)
        offset = (-raw.ctypes.data) % PAGE  # page-aligned, as O_DIRECT file tiers need
        return raw[offset:offset + nbytes]

    def is_pinned(self, buffer: np.ndarray) -> bool:
        attributes = self._cupy.cuda.runtime.pointerGetAttributes(buffer.ctypes.data)
        return bool(attributes.type == self._cupy.cuda.runtime.memoryTypeHost)

    def memory_used(self) -> int:
        """Bytes the device's CuPy memory pool holds in use (every array, not only ours)."""
        return int(self._cupy.get_default_memory_pool().used_bytes())

    def current_stream(self) -> Stream:
        if self._torch is not None:
            return self._torch_stream(self._torch.cuda.current_stream(self.id))
        with self._cuda():
            return _CupyStream(self._cupy.cuda.get_current_stream(), self._cupy)

    def _torch_stream(self, stream: Any) -> Stream:
        """torch's stream as a CuPy stream, made once per CUDA stream (the caller asks at every
        store and load)."""
        pointer = int(stream.cuda_stream)
        known = self._external.get(pointer)
        if known is None:
            from_external = getattr(self._cupy.cuda.Stream, "from_external", None)
            if from_external is not None and hasattr(stream, "__cuda_stream__"):
                external = from_external(stream)  # CuPy >= 14
            else:
                external = self._cupy.cuda.ExternalStream(pointer, self.id)
            known = self._external[pointer] = _CupyStream(external, self._cupy)
        return known

    def new_stream(self) -> Stream:
        with self._cuda():
            return _CupyStream(self._cupy.cuda.Stream(non_blocking=True), self._cupy)

    def elapsed(self, start: Event, end: Event) -> float:
        assert isinstance(start, _CupyEvent) and isinstance(end, _CupyEvent)
        return float(self._cupy.cuda.get_elapsed_time(start.event, end.event)) / 1e3

    def gather(self, arrays: Sequence[Any], buffer: Any, stream: Stream) -> None:
        assert isinstance(stream, _CupyStream)
        offset = 0
        with self._cuda(), stream.stream:
            for array in arrays:
                end = offset + array.nbytes
                self._cupy.copyto(buffer[offset:end].view(array.dtype).reshape(array.shape),
                                  array)
                offset = end

    def scatter(self, buffer: Any, arrays: Sequence[Any], stream: Stream) -> None:
        assert isinstance(stream, _CupyStream)
        offset = 0
        with self._cuda(), stream.stream:
            for array in arrays:
                end = offset + array.nbytes
                self._cupy.copyto(array,
                                  buffer[offset:end].view(array.dtype).reshape(array.shape))
                offset = end

    def _memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream: Stream) -> None:
        assert isinstance(stream, _CupyStream)
        with self._cuda():
            self._cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.stream.ptr)

    def to_host(self, buffer: Any, host: np.ndarray, nbytes: int, stream: Stream) -> None:
        self._memcpy(host.ctypes.data, buffer.data.ptr, nbytes,
                     self._cupy.cuda.runtime.memcpyDeviceToHost, stream)

    def to_device(self, host: np.ndarray, buffer: Any, nbytes: int, stream: Stream) -> None:
        self._memcpy(buffer.data.ptr, host.ctypes.data, nbytes,
                     self._cupy.cuda.runtime.memcpyHostToDevice, stream)

    def warm_up(self) -> None:
        # NVRTC compiles on a first build (CuPy caches it on disk): not inside a sweep
        if self._digest_kernel is None:
            with self._cuda():
                kernel = self._cupy.RawKernel(_DIGEST_SOURCE, "asyncckpt_digest")
                kernel.compile()
                self._digest_blocks = 8 * self._cuda().attributes["MultiProcessorCount"]
                self._digest_kernel = kernel

    def digest(self, buffer: Any, nbytes: int, scratch: Any, out: np.ndarray,
               stream: Stream) -> None:
        assert isinstance(stream, _CupyStream)
        self.warm_up()
        runtime, pointer = self._cupy.cuda.runtime, stream.stream.ptr
        with self._cuda():
            runtime.memsetAsync(scratch.data.ptr, 0, 8, pointer)
            threads = -(-nbytes // 4)
            blocks = max(1, min(self._digest_blocks, -(-threads // _DIGEST_THREADS)))
            self._digest_kernel((blocks,), (_DIGEST_THREADS,),
                                (buffer, np.uint64(nbytes), scratch), stream=stream.stream)
            runtime.memcpyAsync(out.ctypes.data, scratch.data.ptr, 8,
                                runtime.memcpyDeviceToHost, pointer)
