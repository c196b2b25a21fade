"""Memory given back to the system after a sink's backlog (issue 28: the soak's VmRSS steps).

With glibc, each time a block it had mmapped is freed, malloc raises its mmap threshold to that
block's size (up to 32 MiB): once a backlog has gone out in requests of up to --send-max-kb, such
blocks (the spool's batches joined into a request, the request, its answer, and those a failed
request's traceback holds until the garbage collector frees it) come from the heap, which keeps
them: VmRSS steps up at each sink outage and stays there. ``fix_mmap_threshold``, at the start,
fixes the threshold (and the trim threshold with it), so that they go back to the system as they
are freed; ``trim``, once a sink that was down has taken its backlog, gives back what it left free
in the heaps. The C agent does the same (collectors/c/agent/util.h). Elsewhere than glibc, nothing.
"""

from __future__ import annotations

import ctypes
import gc
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter, from glibc's malloc.h
MMAP_THRESHOLD = 128 * 1024  # glibc's default, kept from then on


def _glibc() -> ctypes.CDLL | None:
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        return ctypes.CDLL(None)  # the C library the interpreter runs on
    except (ValueError, OSError, AttributeError):  # not glibc
        return None


_LIBC = _glibc()


def fix_mmap_threshold() -> bool:
    """glibc's mmap threshold fixed at its default (see the module); whether it was."""
    return _LIBC is not None and _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


def trim() -> bool:
    """What the heaps hold free, given back to the system (malloc_trim); whether any was. The
    garbage collector first: the tracebacks of the requests that failed while the sink was down
    are cycles, which hold their requests' blocks until it runs."""
    if _LIBC is None:
        return False
    gc.collect()
    return _LIBC.malloc_trim(0) == 1
