"""Events waiting for the server's ACK, in order, bounded, in memory.

Held in memory (not on the SD card): hardware events are about now, and a reboot is
itself reported. Delivered in order with their original timestamps once the link is
proven live; an event leaves only when the server ACKed it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque

from .model import Event


class Outbox:
    def __init__(self, capacity: int = 500, on_put=None, on_ack=None):
        self.capacity = capacity
        self.on_put = on_put
        self.on_ack = on_ack
        self._items: OrderedDict[int, Event] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0
        self.delivered = 0
        self.recent: deque[Event] = deque(maxlen=5)  # for `edge-agent status`, delivered or not

    def put(self, event: Event) -> None:
        with self._lock:
            self._items[event.id] = event
            if event.type != "device.telemetry":
                self.recent.append(event)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self.dropped += 1
        if self.on_put is not None:
            self.on_put()

    def pending(self) -> list[Event]:
        with self._lock:
            return list(self._items.values())

    def ack(self, event_id: int) -> None:
        with self._lock:
            if self._items.pop(event_id, None) is None:
                return
            self.delivered += 1
        if self.on_ack is not None:
            self.on_ack()

    def __len__(self) -> int:
        return len(self._items)

    def snapshot(self) -> dict:
        """For `edge-agent status`."""
        return {"pending": len(self._items), "delivered": self.delivered,
                "dropped": self.dropped, "recent": [e.payload() for e in list(self.recent)]}
