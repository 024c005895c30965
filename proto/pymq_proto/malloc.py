"""glibc malloc settings for processes that move multi-megabyte wire buffers.

Every pymq process builds and drops buffers of a few MB per request: the
broker's requests and pull answers, the clients' encoded batches and pulls.
glibc maps each buffer over its ``M_MMAP_THRESHOLD`` anew and trims the heap
after a free, so every request pays again, in page faults and zeroing, for
memory it had a moment ago; on the virtual machines measured here that made a
sync ``send_batch`` of 1000 messages ~30% slower (BENCHMARKS.md). Raising both
thresholds keeps those buffers in the heap. It lives here because the broker
and the connector share this package.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

__all__ = ["tune_malloc", "tune_malloc_once"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_lock = threading.Lock()
_tuned_pid = 0


def tune_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds (bytes); True if glibc took them (False elsewhere)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
        )
    except (OSError, AttributeError):  # not glibc
        return False


def tune_malloc_once(mmap_threshold: int = 16 << 20, trim_threshold: int = 64 << 20) -> None:
    """:func:`tune_malloc` once per process, unless ``PYMQ_TUNE_MALLOC=0``.

    A client process keeps at most ``trim_threshold`` of freed heap (64 MiB by
    default) instead of handing it back at once.
    """
    global _tuned_pid
    pid = os.getpid()
    if _tuned_pid == pid:
        return
    with _lock:
        if _tuned_pid != pid:
            _tuned_pid = pid
            if os.environ.get("PYMQ_TUNE_MALLOC", "1") != "0":
                tune_malloc(mmap_threshold, trim_threshold)
