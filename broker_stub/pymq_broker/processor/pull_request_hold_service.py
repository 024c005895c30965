"""PullRequestHoldService: long polling. A pull that finds nothing new waits here.

Runs on the broker's event loop; the store tells it of every new message
(``notify_message_arriving``) and held pulls for that queue wake at once.
"""

from __future__ import annotations

import asyncio


class PullRequestHoldService:
    def __init__(self) -> None:
        # per queue, each held pull's future and the offset it waits past (a dict: thousands of
        # pulls held on one queue leave in O(1) each, not by rebuilding a list)
        self._waiters: dict[tuple[str, int], dict[asyncio.Future[None], int]] = {}

    async def suspend(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Wait until the queue's max offset passes ``offset`` or the timeout; True if it did."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        self._waiters.setdefault(key, {})[fut] = offset
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.pop(fut, None)
                if not waiters:
                    del self._waiters[key]

    def wake_topic(self, topic: str) -> None:
        """The topic was deleted: every pull held on it looks again (and finds it gone)."""
        for (held_topic, _), waiters in list(self._waiters.items()):
            if held_topic == topic:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        for fut, offset in waiters.items():
            if offset < max_offset and not fut.done():
                fut.set_result(None)
