"""Release simulated messages at wall-clock pace, and group them into ticks.

Shared by ``stepwatch simulate --realtime`` and the demo's fleet driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from stepwatch.contract import Message
from stepwatch.errors import ConfigError


def paced(
    messages: Iterable[Message],
    speed: float,
    start: float,
    sleep: Callable[[float], object] = time.sleep,
) -> Iterator[Message]:
    """Release each message when the wall clock reaches its timestamp (scaled by ``speed``).

    ``sleep`` is injectable: the demo passes an interruptible wait.
    """
    if speed <= 0:
        raise ConfigError("--speed must be > 0")
    wall0 = time.time()
    for message in messages:
        delay = wall0 + (message.ts - start) / speed - time.time()
        if delay > 0:
            sleep(delay)
        yield message


def batches(
    messages: Iterable[Message], width: float = 0.25, max_size: int = 2000
) -> Iterator[list[Message]]:
    """Group time-ordered messages into batches at most ``width`` seconds wide
    (one agent tick's worth, as a node agent hands them to its publisher)."""
    batch: list[Message] = []
    for message in messages:
        if batch and (len(batch) >= max_size or message.ts - batch[0].ts >= width):
            yield batch
            batch = []
        batch.append(message)
    if batch:
        yield batch
