"""The store's memory of accepted sender numbers: the ``sender_seqs`` table.

The in-memory filter (:mod:`stepwatch.exporters.clickhouse.senders`) forgets
on a restart, beyond its window and for an evicted sender; ReplacingMergeTree
without a version keeps the *last* insert of a key, and the rollups count
every insert. So the sink records each message it accepts as one row
``(key, host, inst, kind, seq, digest, accepted_at)``, written after the
message's rows, and looks the numbers of every batch up here before inserting
it: a number the store holds with the same digest is a duplicate, with only
other digests a conflict (neither is inserted).

``key`` (:func:`sender_key`) is what a lookup asks for: a 40-bit hash of the
sender followed by the low 24 bits of ``seq``. Plain integers, because
ClickHouse parses a list of 2,000 ``(host, inst, kind, seq)`` tuples ten times
slower than 2,000 integers (about 70 ms against 7 ms a batch); the sender in
the high bits keeps a sender's numbers together in the table's order, so they
compress (about 8.4 bytes a message, the digest 8 of them). Keys can collide;
the lookup keeps only the rows whose four columns match exactly.

Written after the rows, so a crash between the two leaves rows without their
``sender_seqs`` row: the replayed batch is then judged new again and its
insert, repeating the same token, is dropped by the store (exactly once), and
the ``sender_seqs`` row follows. Never the other way round (a number noted
but its rows missing would make the replay a "duplicate" and lose them).
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from stepwatch.exporters.clickhouse.lookups import Key, Lookup, lookup
from stepwatch.exporters.clickhouse.senders import DEFAULT_MAX_SENDERS, SenderSeq
from stepwatch.exporters.clickhouse.store import Store

SEQ_BITS = 24
KEY_BYTES = 22  # the most a key takes in a query: 20 digits and ", "


def sender_key(number: SenderSeq) -> int:
    """The sender's 40-bit hash, then the low 24 bits of its ``seq``."""
    host, inst, kind, seq = number
    return _sender_hash(host, inst, kind) << SEQ_BITS | seq & ((1 << SEQ_BITS) - 1)


@functools.lru_cache(maxsize=DEFAULT_MAX_SENDERS)
def _sender_hash(host: str, inst: str, kind: str) -> int:
    sender = hashlib.blake2b(msgspec.json.encode((host, inst, kind)), digest_size=5).digest()
    return int.from_bytes(sender, "big")


def accepted_row(number: SenderSeq, digest: int, now: float) -> tuple[Any, ...]:
    """A ``sender_seqs`` row (the columns of ``rows.SENDER_SEQS``)."""
    return (sender_key(number), *number, digest, now)


def lookup_accepted(store: Store, numbers: Sequence[SenderSeq]) -> Lookup[frozenset[int]]:
    """The digests the store accepted for each of ``numbers`` that it has (in chunks)."""
    return lookup(list(numbers), lambda chunk: _ask(store, chunk), size=lambda _: KEY_BYTES)


def _ask(store: Store, chunk: list[Key]) -> dict[Key, frozenset[int]]:
    wanted = set(chunk)
    keys = ", ".join(str(k) for k in sorted({sender_key(n) for n in chunk}))
    result = store.query(
        f"SELECT host, inst, kind, seq, digest FROM sender_seqs WHERE key IN ({keys})"
    )
    found: defaultdict[Key, set[int]] = defaultdict(set)
    for host, inst, kind, seq, digest in result.rows:
        number = (str(host), str(inst), str(kind), int(seq))
        if number in wanted:  # not a key collision
            found[number].add(int(digest))
    return {number: frozenset(digests) for number, digests in found.items()}
