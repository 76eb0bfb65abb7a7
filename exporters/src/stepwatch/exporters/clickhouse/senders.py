"""The sink's duplicate filter: bounded by the number of senders, and content-aware.

Agents retry and replay their spool (at-least-once), so the same message can
reach the sink twice. Each sender numbers its messages (``seq`` per ``host``,
``inst``, ``kind``: the contract's header), so the filter keeps, per sender, a
high-water mark, a bitmap of the ``window`` numbers below it and a 64-bit
content hash per slot (:class:`stepwatch.contract.seen.SenderWindow`):

* a number seen before with the same content is a ``duplicate``: dropped;
* a number seen before with *other* content is a ``conflict``: someone reuses
  another sender's identity (or a sender restarted without a new ``inst``).
  Both are stored (the forger who sends first cannot suppress the real data)
  and the later one is also written to ``dead_letters`` with reason
  ``seq_conflict`` so the conflict is visible; the slot then remembers the
  later content (a repeat of it is a duplicate);
* a number further behind the high-water mark than the window is stored (a
  late spool replay must not be lost; the tables' ReplacingMergeTree
  collapses a true repeat);
* a message without ``inst`` (an unstamped sender) is not filtered.

Memory: at most ``max_senders`` senders (least recently seen evicted), each
``window`` x 8 bytes of hashes plus two integers: with the defaults (window
256, 16,384 senders) about 40 MiB at most, whatever the number of messages.
A detection is its own sender (``inst`` = the detection id): its changes are
few and close together, so eviction of old detections loses nothing.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

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


class SenderFilter:
    """Admit each (sender, seq) once per content; see the module docstring."""

    def __init__(
        self, window: int = DEFAULT_WINDOW, max_senders: int = DEFAULT_MAX_SENDERS
    ) -> None:
        self.window = window
        self.max_senders = max_senders
        self._senders: OrderedDict[tuple[str, str, str], SenderWindow] = OrderedDict()
        self.evicted = 0

    def admit(self, message: Message, raw: bytes) -> Verdict:
        if not message.inst:
            return Verdict.NEW
        key = (message.host, message.inst, KIND_OF[type(message)].value)
        senders = self._senders
        win = senders.get(key)
        if win is None:
            win = senders[key] = SenderWindow(self.window)
            if len(senders) > self.max_senders:
                senders.popitem(last=False)
                self.evicted += 1
        else:
            senders.move_to_end(key)
        return win.admit(message.seq, content_digest(message, raw))

    def __len__(self) -> int:
        return len(self._senders)
