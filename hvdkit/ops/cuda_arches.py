"""Which GPU generations a CUDA library was compiled for, read from its own fatbin.

``cuobjdump --list-elf`` answers this, but NVIDIA's cuda-toolkit wheels do not ship
it, and neither does hvdkit's runtime image. The answer is in the library: nvcc
puts every kernel image in the ELF section ``.nv_fatbin`` as a list of entries,
each marked SASS (machine code for one ``sm_XY``, kind 2) or PTX (kind 1, which
the driver compiles for newer GPUs). hvdkit env reports both sets, so "does this
build run on my T4 / RTX 5090?" has an answer before the first NCCL call.

    fatbin_arches("horovod/torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so")
    # CudaArches(sass=(75, 80, 90, 100, 120), ptx=(120,))

The layout was checked against nvcc's own output for known -gencode lists
(tests/cli/test_cuda_arches.py compiles one).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_SASS = 1, 2


@dataclass(frozen=True)
class CudaArches:
    sass: tuple[int, ...]    # compute capabilities with machine code, e.g. 90 for sm_90
    ptx: tuple[int, ...]     # compute capabilities with PTX the driver can compile for newer GPUs


def fatbin_arches(path: str) -> CudaArches | None:
    """The arches in ``path``'s .nv_fatbin section; None when it has no CUDA code (a CPU build)."""
    with open(path, "rb") as f:
        data = f.read()
    section = _elf_section(data, ".nv_fatbin")
    if section is None:
        return None
    sass, ptx = set(), set()
    pos = 0
    while pos + 16 <= len(section):
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", section, pos)
        if magic != FATBIN_MAGIC:
            break
        entry, end = pos + header_size, pos + header_size + body_size
        while entry + 32 <= end:
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", section, entry)
            arch = struct.unpack_from("<I", section, entry + 28)[0]
            (sass if kind == KIND_SASS else ptx if kind == KIND_PTX else set()).add(arch)
            if entry_header == 0:
                break
            entry += entry_header + entry_size
        pos = end
        while pos < len(section) and pos % 8:    # containers are 8-byte aligned
            pos += 1
    return CudaArches(tuple(sorted(sass)), tuple(sorted(ptx)))


def _elf_section(data: bytes, wanted: str) -> bytes | None:
    if data[:4] != b"\x7fELF" or data[4] != 2:     # 64-bit ELF only (x86_64, aarch64)
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, strndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    names_at = headers[strndx][4]
    for name, _type, _flags, _addr, offset, size in headers:
        start = names_at + name
        if data[start:data.index(b"\0", start)].decode(errors="replace") == wanted:
            return data[offset:offset + size]
    return None
