"""The lm keeps the memory it frees, for the next batch of that size.

KV buffers are large (a row of the default model holds 46 KB a token), and joining a long row to a batch,
filtering one out or keeping it in the hot tier allocates tens of megabytes per tensor. glibc returns freed
chunks of that size to the kernel (mmap'd chunks at once, the top of a heap past its trim threshold), and the
next allocation pays a page fault for every 4 KB it touches: a 5,500-token row's join to three short rows
stalled a step for 3 s on this project's VM the first time, and 0.05-0.1 s once its memory was the process's
own. The KV budget bounds what the service holds anyway, so it keeps what it once used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("muestra.lm")

# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The most glibc takes for M_MMAP_THRESHOLD on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX).
_MMAP_THRESHOLD_MAX = 32 << 20


def keep_freed_memory() -> bool:
    """Ask glibc to serve allocations up to 32 MB from its heaps and never to trim them; False without glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    kept = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
    kept = mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1 and kept
    if not kept:
        log.info("the C library does not take mallopt's settings: freed KV memory goes back to the kernel")
    return kept
