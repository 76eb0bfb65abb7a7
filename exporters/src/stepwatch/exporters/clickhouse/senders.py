"""The sink's duplicate filter: bounded by the number of senders, and content-aware.

Agents retry and replay their spool (at-least-once), so the same message can
reach the sink twice. Each sender numbers its messages (``seq`` per ``host``,
``inst``, ``kind``: the contract's header), so the filter keeps, per sender, a
high-water mark, a bitmap of the ``window`` numbers below it and a 64-bit
content hash per slot (:class:`stepwatch.contract.seen.SenderWindow`):

* a number seen before with the same content is a ``duplicate``: dropped;
* a number seen before with *other* content is a ``conflict``: someone reuses
  another sender's identity (or a sender restarted without a new ``inst``).
  It is not stored: it goes to ``dead_letters`` with reason ``seq_conflict``
  (payload and all), and the slot keeps the content accepted first, so a
  replay can never replace what the store holds, in the raw tables (read
  with ``FINAL``) or in the rollups (filled at insert);
* a number further behind the high-water mark than the window is stored (a
  late spool replay must not be lost);
* a message without ``inst`` (an unstamped sender) is not filtered.

Memory forgets (a restart, the window, an evicted sender); the store does not:
the sink looks a batch's numbers up in ``sender_seqs`` first
(:mod:`stepwatch.exporters.clickhouse.prepare`) and passes what the store
accepted for a number to :meth:`SenderFilter.judge`, which then decides.

Memory: at most ``max_senders`` senders (least recently seen evicted), each
``window`` x 8 bytes of hashes plus two integers: with the defaults (window
256, 16,384 senders) about 40 MiB at most, whatever the number of messages.
A detection is its own sender (``inst`` = the detection id): its changes are
few and close together, so eviction of old detections loses nothing.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection

import msgspec

from stepwatch.contract import KIND_OF, DetectionMessage, Message, encode
from stepwatch.contract.seen import SenderWindow, Verdict

DEFAULT_WINDOW = 256
DEFAULT_MAX_SENDERS = 16384


def content_digest(message: Message, raw: bytes) -> int:
    """64-bit hash of what the message says (a detection's producer is not part of it)."""
    if isinstance(message, DetectionMessage) and message.producer:
        raw = encode(msgspec.structs.replace(message, producer=""))
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


SenderSeq = tuple[str, str, str, int]  # (host, inst, kind, seq): one sender number


_KINDS = {cls: kind.value for cls, kind in KIND_OF.items()}


def sender_seq(message: Message) -> SenderSeq | None:
    """The message's sender number; None for an unstamped sender (no ``inst``)."""
    if not message.inst:
        return None
    return (message.host, message.inst, _KINDS[type(message)], message.seq)


class SenderFilter:
    """Admit each (sender, seq) once, with the content first accepted; see the module docstring."""

    def __init__(
        self, window: int = DEFAULT_WINDOW, max_senders: int = DEFAULT_MAX_SENDERS
    ) -> None:
        self.window = window
        self.max_senders = max_senders
        self._senders: OrderedDict[tuple[str, str, str], SenderWindow] = OrderedDict()
        self.evicted = 0

    def admit(self, message: Message, raw: bytes, accepted: Collection[int] = ()) -> Verdict:
        key = sender_seq(message)
        if key is None:
            return Verdict.NEW
        return self.judge(key, content_digest(message, raw), accepted)

    def judge(self, key: SenderSeq, digest: int, accepted: Collection[int] = ()) -> Verdict:
        """The verdict on sender number ``key`` with content ``digest``.

        ``accepted``: the digests the store already holds for this sender
        number (empty: none, or not known); the store decides where it knows.
        """
        win = self._window(key[:3])
        if accepted:
            known = digest in accepted
            keep_first(win, key[3], digest if known else min(accepted))
            return Verdict.DUPLICATE if known else Verdict.CONFLICT
        return keep_first(win, key[3], digest)

    def _window(self, sender: tuple[str, str, str]) -> SenderWindow:
        senders = self._senders
        win = senders.get(sender)
        if win is None:
            win = senders[sender] = SenderWindow(self.window)
            if len(senders) > self.max_senders:
                senders.popitem(last=False)
                self.evicted += 1
        else:
            senders.move_to_end(sender)
        return win

    def __len__(self) -> int:
        return len(self._senders)


def keep_first(win: SenderWindow, n: int, digest: int) -> Verdict:
    """``win.admit``, except that after a conflict the slot keeps the content seen first.

    (``SenderWindow`` remembers the later content; the sink stores the first.)
    """
    slot = n % win.window
    first = win.hashes[slot]
    verdict = win.admit(n, digest)
    if verdict is Verdict.CONFLICT:
        win.hashes[slot] = first
    return verdict
