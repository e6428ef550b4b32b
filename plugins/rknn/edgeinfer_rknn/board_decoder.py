"""WRITTEN FOR THE BOARD, NEVER RUN HERE: decoder segments on an RK3588/RK3576 NPU with shared memory.

No Rockchip board is attached to the development machines, so nothing in this module has run; it is
written against the C API of ``librknnrt.so`` as declared in rknn-toolkit2's ``rknn_api.h``
(https://github.com/airockchip/rknn-toolkit2, rknpu2/runtime/.../include/rknn_api.h): ``rknn_init``,
``rknn_query`` (IN_OUT_NUM, INPUT_ATTR, OUTPUT_ATTR, MEM_SIZE), ``rknn_create_mem``,
``rknn_create_mem_from_fd``, ``rknn_set_io_mem``, ``rknn_mem_sync``, ``rknn_run``, ``rknn_destroy_mem``,
``rknn_destroy``. RKNNLite's Python API copies every input per call and has no shared-memory calls, so
this path binds the C library with ctypes.

Design: the KV cache is one NPU-visible allocation per layer and per K/V (``rknn_create_mem`` on a
first context, imported into every segment graph with ``rknn_create_mem_from_fd``): the graphs read the
past rows in place, the host writes the new rows into the same memory through its CPU mapping (a NumPy
view), so KV is never copied per token. The small per-call inputs (embeddings, rotary rows, mask) and
the outputs have their own allocations per graph. Every allocation must fit one 4 GiB NPU IOMMU window
(``rknn_create_mem`` takes a ``uint32_t`` size; issues 232 and 335 of airockchip/rknn-llm describe the
window), and so must a segment's weights: :func:`check_window` refuses a larger one before loading.

Page-in source (load option ``page_from``): ``storage`` (default) — ``rknn_init`` reads the segment's
``.rknn`` file at every page-in; ``memory`` — every segment's file is read into host RAM once at load and
page-ins initialise from those bytes (for a model that fits the board's DRAM but not the NPU window).
"""

from __future__ import annotations

import ctypes as C
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import BackendUnavailableError, InputError

WINDOW_BYTES = 4 << 30  # one NPU IOMMU window (RK3588)
MAX_DIMS, MAX_NAME = 16, 256
QUERY_IN_OUT_NUM, QUERY_INPUT_ATTR, QUERY_OUTPUT_ATTR, QUERY_MEM_SIZE = 0, 1, 2, 6
TENSOR_FLOAT32, TENSOR_FLOAT16 = 0, 1
FORMAT_NCHW, FORMAT_UNDEFINED = 0, 3
SYNC_TO_DEVICE, SYNC_FROM_DEVICE = 0x1, 0x2


class TensorAttr(C.Structure):
    _fields_ = [("index", C.c_uint32), ("n_dims", C.c_uint32), ("dims", C.c_uint32 * MAX_DIMS),
                ("name", C.c_char * MAX_NAME), ("n_elems", C.c_uint32), ("size", C.c_uint32),
                ("fmt", C.c_int), ("type", C.c_int), ("qnt_type", C.c_int), ("fl", C.c_int8),
                ("zp", C.c_int32), ("scale", C.c_float), ("w_stride", C.c_uint32),
                ("size_with_stride", C.c_uint32), ("pass_through", C.c_uint8), ("h_stride", C.c_uint32)]


class TensorMem(C.Structure):
    _fields_ = [("virt_addr", C.c_void_p), ("phys_addr", C.c_uint64), ("fd", C.c_int32), ("offset", C.c_int32),
                ("size", C.c_uint32), ("flags", C.c_uint32), ("priv_data", C.c_void_p)]


class InOutNum(C.Structure):
    _fields_ = [("n_input", C.c_uint32), ("n_output", C.c_uint32)]


class MemSize(C.Structure):
    _fields_ = [("total_weight_size", C.c_uint32), ("total_internal_size", C.c_uint32),
                ("total_dma_allocated_size", C.c_uint64), ("total_sram_size", C.c_uint32),
                ("free_sram_size", C.c_uint32), ("reserved", C.c_uint32 * 10)]


def library(path: Path | None) -> Any:
    if path is None:
        raise BackendUnavailableError("librknnrt.so is not installed",
                                      "copy librknnrt.so from rknn-toolkit2's rknpu2 runtime to /usr/lib")
    lib = C.CDLL(str(path))
    ctx = C.c_uint64  # rknn_context on aarch64
    lib.rknn_init.argtypes = [C.POINTER(ctx), C.c_char_p, C.c_uint32, C.c_uint32, C.c_void_p]
    lib.rknn_query.argtypes = [ctx, C.c_int, C.c_void_p, C.c_uint32]
    lib.rknn_create_mem.argtypes = [ctx, C.c_uint32]
    lib.rknn_create_mem.restype = C.POINTER(TensorMem)
    lib.rknn_create_mem_from_fd.argtypes = [ctx, C.c_int32, C.c_void_p, C.c_uint32, C.c_int32]
    lib.rknn_create_mem_from_fd.restype = C.POINTER(TensorMem)
    lib.rknn_set_io_mem.argtypes = [ctx, C.POINTER(TensorMem), C.POINTER(TensorAttr)]
    lib.rknn_mem_sync.argtypes = [ctx, C.POINTER(TensorMem), C.c_int]
    lib.rknn_run.argtypes = [ctx, C.c_void_p]
    lib.rknn_destroy_mem.argtypes = [ctx, C.POINTER(TensorMem)]
    lib.rknn_destroy.argtypes = [ctx]
    return lib


def _ok(ret: int, what: str) -> None:
    if ret != 0:
        raise RuntimeError(f"{what} failed with RKNN error {ret}")


def check_window(nbytes: int, what: str) -> None:
    """One allocation must fit one NPU IOMMU window."""
    if nbytes >= WINDOW_BYTES:
        raise InputError(f"{what} needs {nbytes / 2**30:.2f} GiB in one NPU allocation, more than the 4 GiB IOMMU "
                         "window; convert with more segments")


class SharedKV:
    """The KV cache in NPU-visible memory: one allocation per (layer, K/V), a NumPy view of each."""

    def __init__(self, lib: Any, graph_path: Path, layers: int, kv_heads: int, context: int, head_dim: int):
        self.lib, self.ctx = lib, C.c_uint64(0)
        _ok(lib.rknn_init(C.byref(self.ctx), str(graph_path).encode(), 0, 0, None), "rknn_init (KV owner)")
        shape = (1, kv_heads, context, head_dim)
        nbytes = int(np.prod(shape)) * 2
        check_window(nbytes, "one layer's K (or V) cache")
        self.mems: dict[str, Any] = {}
        self.views: dict[str, np.ndarray] = {}
        for i in range(layers):
            for kind in ("k", "v"):
                mem = lib.rknn_create_mem(self.ctx, nbytes)
                if not mem:
                    raise MemoryError(f"rknn_create_mem({nbytes}) failed for past_{kind}_{i}")
                buf = (C.c_uint8 * nbytes).from_address(mem.contents.virt_addr)
                self.mems[f"past_{kind}_{i}"] = mem
                self.views[f"past_{kind}_{i}"] = np.frombuffer(buf, np.float16).reshape(shape)
                self.views[f"past_{kind}_{i}"][:] = 0

    def release(self) -> None:
        for mem in self.mems.values():
            self.lib.rknn_destroy_mem(self.ctx, mem)
        self.mems.clear()
        self.lib.rknn_destroy(self.ctx)


class ZeroCopyGraph:
    """One segment graph: KV inputs bound to the shared cache, the other inputs/outputs in own memory."""

    def __init__(self, lib: Any, path: Path, kv: SharedKV, model: bytes | None = None):
        self.lib, self.kv, self.ctx = lib, kv, C.c_uint64(0)
        # size 0: the runtime reads the file (storage); size > 0: the bytes already in host RAM
        src, size = (str(path).encode(), 0) if model is None else (model, len(model))
        _ok(lib.rknn_init(C.byref(self.ctx), src, size, 0, None), f"rknn_init {path.name}")
        size = MemSize()
        _ok(lib.rknn_query(self.ctx, QUERY_MEM_SIZE, C.byref(size), C.sizeof(size)), "rknn_query MEM_SIZE")
        check_window(size.total_weight_size, f"{path.name}'s weights")
        num = InOutNum()
        _ok(lib.rknn_query(self.ctx, QUERY_IN_OUT_NUM, C.byref(num), C.sizeof(num)), "rknn_query IN_OUT_NUM")
        self.own: list[Any] = []
        self.inputs: dict[str, tuple[Any, np.ndarray | None]] = {}
        self.outputs: dict[str, tuple[Any, np.ndarray]] = {}
        for i in range(num.n_input):
            attr = self._attr(QUERY_INPUT_ATTR, i)
            name = attr.name.decode()
            attr.type, attr.fmt, attr.pass_through = TENSOR_FLOAT16, FORMAT_NCHW, 0  # runtime converts layout
            if name in kv.mems:  # the shared cache: imported, never copied
                src = kv.mems[name].contents
                mem = lib.rknn_create_mem_from_fd(self.ctx, src.fd, src.virt_addr, src.size, 0)
                self._bind(mem, attr)
                self.inputs[name] = (mem, None)
            else:
                mem = self._alloc(attr.n_elems * 2, name)
                self._bind(mem, attr)
                self.inputs[name] = (mem, self._view(mem, attr))
        for i in range(num.n_output):
            attr = self._attr(QUERY_OUTPUT_ATTR, i)
            attr.type, attr.fmt = TENSOR_FLOAT32, FORMAT_NCHW
            mem = self._alloc(attr.n_elems * 4, attr.name.decode())
            self._bind(mem, attr)
            self.outputs[attr.name.decode()] = (mem, self._view(mem, attr, np.float32))

    def _attr(self, cmd: int, i: int) -> TensorAttr:
        attr = TensorAttr(index=i)
        _ok(self.lib.rknn_query(self.ctx, cmd, C.byref(attr), C.sizeof(attr)), "rknn_query ATTR")
        return attr

    def _alloc(self, nbytes: int, name: str) -> Any:
        check_window(nbytes, name)
        mem = self.lib.rknn_create_mem(self.ctx, nbytes)
        if not mem:
            raise MemoryError(f"rknn_create_mem({nbytes}) failed for {name}")
        self.own.append(mem)
        return mem

    def _bind(self, mem: Any, attr: TensorAttr) -> None:
        _ok(self.lib.rknn_set_io_mem(self.ctx, mem, C.byref(attr)), f"rknn_set_io_mem {attr.name.decode()}")

    @staticmethod
    def _view(mem: Any, attr: TensorAttr, dtype: Any = np.float16) -> np.ndarray:
        shape = tuple(attr.dims[k] for k in range(attr.n_dims))
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.frombuffer((C.c_uint8 * nbytes).from_address(mem.contents.virt_addr), dtype).reshape(shape)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, (mem, view) in self.inputs.items():
            if view is not None:
                view[...] = feeds[name]
            self.lib.rknn_mem_sync(self.ctx, mem, SYNC_TO_DEVICE)  # KV rows the host wrote last call too
        _ok(self.lib.rknn_run(self.ctx, None), "rknn_run")
        out = {}
        for name, (mem, view) in self.outputs.items():
            self.lib.rknn_mem_sync(self.ctx, mem, SYNC_FROM_DEVICE)
            out[name] = view.copy()
        return out

    def close(self) -> None:
        for mem in self.own + [m for m, v in self.inputs.values() if v is None]:
            self.lib.rknn_destroy_mem(self.ctx, mem)
        self.own.clear()
        self.lib.rknn_destroy(self.ctx)
