"""glibc heap hygiene for long-running processes (the sidecar runs for weeks).

Native, short-lived allocations made in many threads (tantivy's indexing arenas, the slot
pool, the HTTP server, the driver) leave each thread arena's freed chunks fragmented and
resident, so a sidecar's RSS grows with its turns while the Python heap stays flat. The
remedies below bound that; what they measured in `python -m bench.sidecar_soak`:
docs/decisions/heap-hygiene.md. All are no-ops where the C library is not glibc:

- `limit_arenas` (flows/__init__.py, before any thread exists): at most two malloc arenas
  instead of eight per core, so freed chunks are reused rather than stranded in an arena of a
  thread that no longer allocates;

- `keep_large_allocations_mapped`: fix the mmap threshold, so blocks of 1 MB and more are
  always their own mapping and go back to the OS when freed (glibc's dynamic threshold
  otherwise rises to the largest block freed and carves later ones out of the arenas);
- `HeapTrimmer`: every N turns, `malloc_trim(0)` hands the free pages inside every arena back;
- `freeze_startup_objects` (a server, once started): the objects that live as long as the
  process (modules, schemas, the embedder, the graph's driver) leave the cyclic collector's
  scans, so its full collections, which hold the GIL, walk only what requests made since.
"""

from __future__ import annotations

import ctypes
import gc
import threading

#: Allocations at least this large always get their own mapping.
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt parameters (malloc.h)
_M_ARENA_MAX = -8
#: Malloc arenas a long-running server uses (glibc's default: 8 per core).
SERVER_ARENAS = 2

_libc: ctypes.CDLL | None = None
_libc_loaded = False
_threshold_set = False
_lock = threading.Lock()


def _glibc() -> ctypes.CDLL | None:
    global _libc, _libc_loaded
    if not _libc_loaded:
        _libc_loaded = True
        try:
            libc = ctypes.CDLL("libc.so.6")
            _libc = libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
        except OSError:
            _libc = None
    return _libc


def keep_large_allocations_mapped() -> None:
    """Fix glibc's mmap threshold (once per process; setting it turns the dynamic one off)."""
    global _threshold_set
    with _lock:
        if _threshold_set:
            return
        _threshold_set = True
        libc = _glibc()
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def limit_arenas(count: int = SERVER_ARENAS) -> None:
    """At most `count` malloc arenas. glibc reads the limit once, when a thread other than
    the main one first allocates: later calls change nothing."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, count)


def freeze_startup_objects() -> int:
    """Collect once, then move every object alive now to the collector's permanent generation
    (`gc.freeze`, as CPython's documentation advises for servers after startup); how many.
    Measured in `python -m bench.sidecar_load` at 16 conversations: Python's full collections
    went from ~140 to ~70 ms each."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def trim() -> bool:
    """Give the free pages of every malloc arena back to the OS; True when glibc did."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


class HeapTrimmer:
    """`tick()` once per unit of work (a turn); every `every` ticks the heap is trimmed
    (a few milliseconds, in the ticking thread)."""

    def __init__(self, every: int = 50) -> None:
        self.every = every
        self._count = 0
        self._lock = threading.Lock()
        self.trims = 0

    def tick(self) -> None:
        with self._lock:
            self._count += 1
            due = self._count % self.every == 0
        if due:
            trim()
            self.trims += 1
