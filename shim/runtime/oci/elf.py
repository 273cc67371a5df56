"""Just enough ELF to tell a static executable: the file header and the program header table."""

from __future__ import annotations

import struct

__all__ = ["PT_INTERP", "NotElf", "has_interpreter"]

PT_INTERP = 3  # the program header naming the dynamic loader
_HEADER_BYTES = 64  # an ELF64 file header; an ELF32 one is shorter
_CLASSES = {1: ("I", 28, 42), 2: ("Q", 32, 54)}  # EI_CLASS -> (e_phoff format, its offset, e_phentsize's offset)
_BYTE_ORDERS = {1: "<", 2: ">"}  # EI_DATA


class NotElf(ValueError):
    """The file is not an ELF file this module can read."""


def has_interpreter(path: str) -> bool:
    """Whether the ELF file at ``path`` has a program interpreter (it is dynamically linked).

    Raises NotElf when it is not an ELF file, OSError when it cannot be read.
    """
    with open(path, "rb") as f:
        header = f.read(_HEADER_BYTES)
        if len(header) < _HEADER_BYTES or header[:4] != b"\x7fELF" or header[4] not in _CLASSES \
                or header[5] not in _BYTE_ORDERS:
            raise NotElf(f"{path} is not an ELF file")
        order = _BYTE_ORDERS[header[5]]
        offset_format, offset_at, entry_size_at = _CLASSES[header[4]]
        (phoff,) = struct.unpack_from(order + offset_format, header, offset_at)
        phentsize, phnum = struct.unpack_from(order + "HH", header, entry_size_at)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(min(phnum, len(table) // max(phentsize, 1))):
        if struct.unpack_from(order + "I", table, i * phentsize)[0] == PT_INTERP:
            return True
    return False
