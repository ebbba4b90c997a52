"""An int64 -> int64 hash map in two flat arrays (open addressing, linear probing), for the suffix drafter's tree
edges (sim/core/drafters/suffix.py: parent * 2**32 + token -> child): one key at a time from Python (get / put /
delete) or many at once with numpy (get_many / put_many), over the same arrays.

A dict of millions of int keys costs about 100 bytes and a few cache misses per entry, and numpy cannot look
many keys up at once in it; here an entry costs 16 bytes in a table kept at most half full (keys[i] = -1:
empty, -2: deleted), and a batch of look-ups is one vectorised probe loop.
Slot of key k: (k * 0x9E3779B97F4A7C15 mod 2**64) >> (64 - bits) (Fibonacci hashing), then k's run of
occupied slots forward (mod 2**bits). Keys are >= 0. Invariants: every live key sits in the run from its
slot; used + deleted <= capacity / 2 (a put past it rebuilds the table twice as large, dropping deleted slots).
"""
from __future__ import annotations

from array import array

import numpy as np

_MULT = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
EMPTY, DELETED = -1, -2


class EdgeTable:
    """Open-addressing map of int64 keys >= 0 to int64 values (module docstring)."""

    def __init__(self, bits: int = 8) -> None:
        self.used = 0     # live keys
        self.deleted = 0  # slots marked deleted (kept so that probe runs stay whole)
        self._make(bits)

    def _make(self, bits: int) -> None:
        self.bits, self.mask, self.shift = bits, (1 << bits) - 1, 64 - bits
        self._k = array("q", bytes(8 * (1 << bits)))
        self._v = array("q", bytes(8 * (1 << bits)))
        self.keys = np.frombuffer(self._k, dtype=np.int64)  # writable views of the same memory (never resized)
        self.vals = np.frombuffer(self._v, dtype=np.int64)
        self.keys[:] = EMPTY

    def __len__(self) -> int:
        return self.used

    def _room(self, n: int) -> None:
        """Rebuild (larger, without deleted slots) if n more keys would fill over half the table."""
        if 2 * (self.used + self.deleted + n) <= self.mask + 1:
            return
        live = self.keys >= 0
        keys, vals = self.keys[live].copy(), self.vals[live].copy()
        bits = self.bits
        while 4 * (self.used + n) > (1 << bits):  # a quarter full after it: room to grow before the next
            bits += 1
        self._make(bits)
        self.used = self.deleted = 0
        if len(keys):
            self._put_new(keys, vals)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * np.uint64(_MULT)) >> np.uint64(self.shift)).astype(np.int64)

    # ------------------------------------------------------------------ one key (Python ints)
    def get(self, key: int, default=None):
        k, i, mask = self._k, ((key * _MULT) & _M64) >> self.shift, self.mask
        while True:
            x = k[i]
            if x == key:
                return self._v[i]
            if x == EMPTY:
                return default
            i = (i + 1) & mask

    def put(self, key: int, val: int) -> None:
        """Add `key` (not in the table) -> val."""
        self._room(1)
        k, i, mask = self._k, ((key * _MULT) & _M64) >> self.shift, self.mask
        while k[i] >= 0:
            i = (i + 1) & mask
        if k[i] == DELETED:
            self.deleted -= 1
        k[i] = key
        self._v[i] = val
        self.used += 1

    def delete(self, key: int) -> None:
        """Remove `key` (in the table)."""
        k, i, mask = self._k, ((key * _MULT) & _M64) >> self.shift, self.mask
        while k[i] != key:
            i = (i + 1) & mask
        k[i] = DELETED
        self.used -= 1
        self.deleted += 1

    # ------------------------------------------------------------------ many keys (numpy)
    def get_many(self, keys: np.ndarray) -> np.ndarray:
        """Values of `keys` (int64), -1 where a key is absent."""
        out = np.full(len(keys), -1, dtype=np.int64)
        idx = np.arange(len(keys))
        want = keys
        at = self._slots(keys)
        while len(idx):
            x = self.keys[at]
            hit = x == want
            out[idx[hit]] = self.vals[at[hit]]
            go = ~hit & (x != EMPTY)
            idx, want, at = idx[go], want[go], (at[go] + 1) & self.mask
        return out

    def put_many(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Add distinct `keys`, none in the table, -> `vals`."""
        self._room(len(keys))
        self._put_new(np.asarray(keys, dtype=np.int64), np.asarray(vals, dtype=np.int64))

    def _put_new(self, keys: np.ndarray, vals: np.ndarray) -> None:
        idx = np.arange(len(keys))
        at = self._slots(keys)
        while len(idx):
            free = np.flatnonzero(self.keys[at] < 0)
            s = at[free]
            was_deleted = self.keys[s] == DELETED
            mine = keys[idx[free]]
            self.keys[s] = mine  # keys aiming at the same free slot: one of them lands (the keys are distinct,
            landed = self.keys[s] == mine  # so reading back tells which), the others probe on
            win = free[landed]
            self.deleted -= int(was_deleted[landed].sum())
            self.vals[at[win]] = vals[idx[win]]
            lose = np.ones(len(idx), dtype=bool)
            lose[win] = False
            idx, at = idx[lose], (at[lose] + 1) & self.mask
        self.used += len(keys)
