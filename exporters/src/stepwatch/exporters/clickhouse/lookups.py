"""Keyed lookups in the store that one bad key cannot spoil for the others.

The sink asks the store about a batch's keys (the last counter reading of a
GPU or port, the content accepted for a sender number) with the keys written
into the query as literals. A query has a size limit (ClickHouse's
``max_query_size``, 256 KiB by default) and a key is whatever a sender put in
its names, so:

* keys are asked about in chunks of at most ``max_keys`` keys and
  ``max_bytes`` bytes of key literals (a quarter of the limit: room for a
  query that names each key twice, and for the rest of it);
* a key whose literal alone is over ``max_bytes`` is not asked about
  (``skipped``);
* a chunk the store refuses (it answered with an error code: the query is the
  problem) is split in halves, down to the single keys it refuses, which are
  ``skipped``; every other key still gets its answer. After ``max_failures``
  refusals the rest is left ``unasked``;
* an error the store did not answer (unreachable, closed) ends the lookup: the
  keys not asked yet are left ``unasked``, for the caller to ask again later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.store import ClickHouseError

Key = tuple[Any, ...]
V = TypeVar("V")

MAX_KEYS = 2000
MAX_BYTES = 64 << 10
MAX_FAILURES = 64


@dataclass(frozen=True)
class Limits:
    max_keys: int = MAX_KEYS
    max_bytes: int = MAX_BYTES  # of key literals per query; a longer key is skipped
    max_failures: int = MAX_FAILURES  # refused queries per lookup before giving up


@dataclass(frozen=True)
class Lookup(Generic[V]):
    """What the store said, and about which keys it could not be asked."""

    found: dict[Key, V]
    skipped: list[Key]  # too long to ask about, or refused by the store on its own
    unasked: list[Key]  # not asked: the store did not answer (ask again later)
    error: StoreError | None = None  # the first error met

    def answered(self, keys: Sequence[Key]) -> list[Key]:
        """The keys the store answered about (found or not)."""
        missing = {*self.skipped, *self.unasked}
        return [k for k in keys if k not in missing]


def literal(value: Any) -> str:
    """A ClickHouse literal of an int or a string (quotes and backslashes escaped)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def tuple_literal(key: Key) -> str:
    return "(" + ", ".join(literal(v) for v in key) + ")"


def key_bytes(key: Key) -> int:
    return len(tuple_literal(key).encode("utf-8", "surrogatepass"))


def lookup(
    keys: Sequence[Key],
    ask: Callable[[list[Key]], dict[Key, V]],
    limits: Limits = Limits(),
    size: Callable[[Key], int] = key_bytes,
) -> Lookup[V]:
    """Ask ``ask`` about ``keys`` in bounded chunks; see the module docstring.

    ``size``: the bytes a key takes in the query (its literal by default).
    """
    run: _Run[V] = _Run(ask, limits)
    fits: list[tuple[Key, int]] = []
    for key in dict.fromkeys(keys):
        n = size(key)
        if n <= limits.max_bytes:
            fits.append((key, n))
        else:
            run.skipped.append(key)
    chunks = list(_chunks(fits, limits))
    for i, chunk in enumerate(chunks):
        if not run.ask(chunk):
            run.unasked.extend(k for later in chunks[i + 1 :] for k in later)
            break
    return Lookup(run.found, run.skipped, run.unasked, run.error)


def _chunks(keys: list[tuple[Key, int]], limits: Limits) -> Iterator[list[Key]]:
    chunk: list[Key] = []
    size = 0
    for key, n in keys:
        if chunk and (len(chunk) >= limits.max_keys or size + n > limits.max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(key)
        size += n
    if chunk:
        yield chunk


def _refused(err: StoreError) -> bool:
    """The store answered and refused this query (so a smaller one may pass)."""
    return isinstance(err, ClickHouseError) and err.code is not None


@dataclass
class _Run(Generic[V]):
    ask_store: Callable[[list[Key]], dict[Key, V]]
    limits: Limits
    found: dict[Key, V] = field(default_factory=dict)
    skipped: list[Key] = field(default_factory=list)
    unasked: list[Key] = field(default_factory=list)
    error: StoreError | None = None
    failures: int = 0

    def ask(self, chunk: list[Key]) -> bool:
        """Ask about ``chunk``, halving it around refused keys; False: stop asking."""
        try:
            self.found.update(self.ask_store(chunk))
            return True
        except StoreError as err:
            self.error = self.error or err
            if not _refused(err) or self.failures >= self.limits.max_failures:
                self.unasked.extend(chunk)
                return False
            self.failures += 1
        if len(chunk) == 1:
            self.skipped.extend(chunk)
            return True
        mid = len(chunk) // 2
        if not self.ask(chunk[:mid]):
            self.unasked.extend(chunk[mid:])
            return False
        return self.ask(chunk[mid:])
