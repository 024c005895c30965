"""zlib's CRC-32 of many equal-width slices of one buffer at once, with numpy.

The index hashes every stored UNIQ_KEY (``zlib.crc32(key, seed)``, see
:func:`~.index_service.key_hash`): one Python call per key was 16% of the broker's CPU in
a Spark sink. For keys of one width ``w`` the CRC is affine in the key's bits, so
``crc32(key, seed) == crc32(bytes(w), seed) ^ XOR over j of T[j][key[j]]``, where ``T[j][b]``
is what byte ``b`` at position ``j`` contributes (independent of the seed). Tables are kept
per width for byte pairs (65,536 entries per pair of positions: 4 MiB for a 32-byte key),
so a key costs ``w / 2`` table look-ups in one numpy expression: 1,000 keys of 32 bytes
take ~75 µs against ~210 µs for the loop, with the same results.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np
import numpy.typing as npt
from pymq_proto.crc32 import crc32

from .byte_windows import byte_windows

__all__ = ["MAX_WIDTH", "crc32_equal_width", "crc32_slices"]

MAX_WIDTH = 48
"""Wider slices are left to the caller's loop: tables grow with the width (6 MiB at 48)."""


@functools.lru_cache(maxsize=2)  # RocketMQ's and pymq's UNIQ_KEYs are all 32 hex digits
def _pair_tables(width: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    """Flattened tables of byte pairs (the little-endian uint16 of bytes 2p, 2p+1) and their starts.

    An odd width gets a last "pair" whose high byte is always zero (the caller pads with it).
    """
    pairs = (width + 1) // 2
    zeros = bytes(width)
    base = zlib.crc32(zeros)
    single = np.zeros((2 * pairs, 256), dtype=np.uint32)
    for j in range(width):
        for b in range(256):
            single[j, b] = zlib.crc32(zeros[:j] + bytes((b,)) + zeros[j + 1 :]) ^ base
    tables = (single[0::2, None, :] ^ single[1::2, :, None]).reshape(pairs, 65536)
    return tables.ravel(), np.arange(pairs, dtype=np.int64) * 65536


def crc32_equal_width(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], width: int, seed: int = 0
) -> npt.NDArray[np.uint32]:
    """``zlib.crc32(buf[s : s + width], seed)`` for every ``s`` of ``starts`` (1 ≤ width ≤ MAX_WIDTH).

    Every slice must lie within ``buf``.
    """
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width {width} is outside 1..{MAX_WIDTH}")
    flat, offsets = _pair_tables(width)
    keys = byte_windows(buf, width)[starts]  # a contiguous copy, one row per slice
    if width % 2:
        keys = np.concatenate([keys, np.zeros((len(starts), 1), dtype=np.uint8)], axis=1)
    pairs = keys.view("<u2")
    crcs: npt.NDArray[np.uint32] = np.bitwise_xor.reduce(flat[pairs + offsets], axis=1)
    crcs ^= np.uint32(zlib.crc32(bytes(width), seed))
    return crcs


def crc32_slices(
    buf: bytes | bytearray, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], seed: int = 0
) -> npt.NDArray[np.uint32]:
    """``zlib.crc32(buf[s:e], seed)`` of each slice: hashed together when there are many of one
    width up to :data:`MAX_WIDTH` (UNIQ_KEYs, one tag for a batch), else one call each."""
    widths = ends - starts
    if len(starts) > 8 and 1 <= widths[0] <= MAX_WIDTH and (widths == widths[0]).all():
        return crc32_equal_width(np.frombuffer(buf, dtype=np.uint8), starts, int(widths[0]), seed)
    mv = memoryview(buf)
    try:
        return np.array([crc32(mv[a:b], seed) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)],
                        dtype=np.uint32)
    finally:
        mv.release()
