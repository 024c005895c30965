"""PullRequestHoldService: long polling. A pull that finds nothing new waits here.

Runs on the broker's event loop; the store tells it of every new message
(``notify_message_arriving``) and held pulls for that queue wake at once.
"""

from __future__ import annotations

import asyncio


class PullRequestHoldService:
    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}

    async def suspend(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Wait until the queue's max offset passes ``offset`` or the timeout; True if it did."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        self._waiters.setdefault(key, []).append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                self._waiters[key] = [w for w in waiters if w[1] is not fut]
                if not self._waiters[key]:
                    del self._waiters[key]

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        for offset, fut in waiters:
            if offset < max_offset and not fut.done():
                fut.set_result(None)
