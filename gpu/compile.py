"""Compile kernels.cu with NVRTC through ctypes: the CPU-only proof that every kernel builds for sm_90.

Why ctypes and not CuPy: CI and developers have no GPU (and often no CuPy), but the NVRTC shared
library from the `nvidia-cuda-nvrtc` wheel compiles CUDA C to Hopper machine code without a device.
Running this in CI means a kernel that does not compile is caught before anyone spends device time.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

NVRTC_SUCCESS = 0


@dataclass(frozen=True)
class CompileResult:
    """What one NVRTC compilation produced: the arch, cubin size, mangled names and the log."""

    arch: str
    cubin_bytes: int
    lowered_names: dict[str, str]
    log: str


class NvrtcNotFound(RuntimeError):
    """libnvrtc could not be located (install the `nvidia-cuda-nvrtc` wheel)."""


class NvrtcCompileError(RuntimeError):
    """NVRTC rejected the source; the message carries the compiler log."""


def _candidate_paths() -> list[str]:
    """Where libnvrtc may live: the pip wheels (cu13 and older layouts), CUDA_HOME, the loader path."""
    patterns: list[str] = []
    for site in {p for p in sys.path if p.endswith("site-packages")}:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"):
            patterns.append(os.path.join(site, sub, "libnvrtc.so*"))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            patterns.append(os.path.join(os.environ[env], "lib64", "libnvrtc.so*"))
    patterns.append("/usr/local/cuda/lib64/libnvrtc.so*")
    found: list[str] = []
    for pattern in patterns:
        found.extend(p for p in sorted(glob.glob(pattern)) if "builtins" not in os.path.basename(p))
    return found


@lru_cache(maxsize=1)
def load_nvrtc() -> ctypes.CDLL:
    """The NVRTC library, or NvrtcNotFound naming the places that were searched."""
    tried = _candidate_paths()
    for path in tried:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        _declare(lib)
        return lib
    try:  # last resort: the dynamic loader's search path
        lib = ctypes.CDLL("libnvrtc.so")
        _declare(lib)
        return lib
    except OSError as exc:
        raise NvrtcNotFound(
            f"libnvrtc not found (tried {len(tried)} wheel/CUDA paths and the loader)"
        ) from exc


def _declare(lib: ctypes.CDLL) -> None:
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(vp),
        cp,
        cp,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.nvrtcAddNameExpression.argtypes = [vp, cp]
    lib.nvrtcCompileProgram.argtypes = [vp, ctypes.c_int, ctypes.POINTER(cp)]
    lib.nvrtcGetProgramLogSize.argtypes = [vp, ctypes.POINTER(sz)]
    lib.nvrtcGetProgramLog.argtypes = [vp, cp]
    lib.nvrtcGetCUBINSize.argtypes = [vp, ctypes.POINTER(sz)]
    lib.nvrtcGetLoweredName.argtypes = [vp, cp, ctypes.POINTER(cp)]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(vp)]
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = cp
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]


def compile_source(
    source: str, name_expressions: list[str], arch: str = "sm_90", options: tuple[str, ...] = ("-std=c++17",)
) -> CompileResult:
    """Compile `source` to a cubin for `arch`, instantiating each name expression; raise on any error."""
    lib = load_nvrtc()
    prog = ctypes.c_void_p()

    def check(status: int, what: str) -> None:
        if status != NVRTC_SUCCESS:
            raise NvrtcCompileError(f"{what}: {lib.nvrtcGetErrorString(status).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None), "create")
    try:
        for expr in name_expressions:
            check(lib.nvrtcAddNameExpression(prog, expr.encode()), f"name expression {expr}")
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
        argv = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
        log_buf = ctypes.create_string_buffer(max(log_size.value, 1))
        lib.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.value.decode(errors="replace").strip()
        if status != NVRTC_SUCCESS:
            raise NvrtcCompileError(
                f"NVRTC failed for {arch}: {lib.nvrtcGetErrorString(status).decode()}\n{log}"
            )
        cubin_size = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin_size)), "cubin size")
        lowered: dict[str, str] = {}
        for expr in name_expressions:
            name = ctypes.c_char_p()
            check(lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(name)), f"lowered name {expr}")
            lowered[expr] = name.value.decode()
        return CompileResult(arch=arch, cubin_bytes=int(cubin_size.value), lowered_names=lowered, log=log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def kernel_source() -> str:
    """The text of gpu/kernels.cu (shipped as package data)."""
    return (Path(__file__).with_name("kernels.cu")).read_text()
