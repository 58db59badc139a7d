"""Ask Linux for 2 MB pages under a big vector's memory (a hint; elsewhere a no-op).

`routing.topic_index` keeps a million routes' edges in one 64 MB vector and a lookup
reads a few slots of it at random. On 4 KB pages each such read is also a TLB miss and
a page walk (dear in a VM); on 2 MB pages the whole vector fits the TLB: 12 % less CPU
per new-topic lookup at a million routes, side by side in one process (RESULTS.md,
"New-topic lookup at a million routes"). Transparent huge pages must be enabled as
`always` or `madvise` (the usual default); the advice is given before the memory is
first touched, so the kernel backs it with huge pages as it is faulted in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Callable

__all__ = ["HUGE_PAGE", "advise_huge_pages"]

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


class _Buffer(ctypes.Structure):  # CPython's Py_buffer
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _load_madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    advise: Callable[[int, int, int], int] = madvise
    return advise


_madvise = _load_madvise()


def _address(obj: object) -> int | None:
    """The start of the memory behind `obj`'s buffer (a vector's items, even when empty)."""
    view = _Buffer()
    if ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(obj), ctypes.byref(view), 0) != 0:
        return None
    try:
        address: int | None = view.buf
        return address
    finally:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(view))


def advise_huge_pages(obj: object, nbytes: int) -> bool:
    """Advise huge pages for the 2 MB-aligned part of the `nbytes` that `obj`'s buffer
    starts (its allocation must be that long, as a vector's capacity is). True if the
    kernel took the advice."""
    if _madvise is None or nbytes < 2 * HUGE_PAGE:
        return False
    try:
        start = _address(obj)
    except (TypeError, ValueError, OSError):
        return False
    if not start:
        return False
    first = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    end = (start + nbytes) // HUGE_PAGE * HUGE_PAGE
    if end <= first:
        return False
    return _madvise(first, end - first, _MADV_HUGEPAGE) == 0
