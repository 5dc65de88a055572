"""The upload queue, assembled: the queue on the card (which may be unusable: the agent
runs on, holding uploads), its worker, and the way its items go: over the link's port
where the server's profile carries them, else by HTTP (docs/PROTOCOL.md)."""
from __future__ import annotations

from typing import Callable

from ..config.model import Server
from ..config.policies import UploadPolicy
from ..link.port import LinkPort
from ..runtime.watchdog_gate import WatchdogGate
from .link_sender import LinkUploadSender
from .sender import UploadSender
from .store import QueueStore, QueueUnavailable
from .worker import UploadWorker


def assemble(policy: UploadPolicy, queue_path: str, *, profile, link: LinkPort, server: Server,
             identity: Callable[[], tuple[str, str] | None], gate: WatchdogGate | None,
             on_change: Callable[[], None],
             on_storage_failed: Callable[[Exception], None]) -> UploadWorker:
    """The worker over the queue at ``queue_path``; its ``store`` is None where the card
    refused it (``on_storage_failed`` has heard why)."""
    try:
        store: QueueStore | None = QueueStore(queue_path, policy)
    except (QueueUnavailable, OSError) as e:   # the card, a link planted in the spool
        store = None
        on_storage_failed(e)
    sender = (LinkUploadSender(link, profile) if profile.link_upload_kinds
              else UploadSender(server.url, identity, server.egress))
    worker = UploadWorker(store, sender, policy, gate=gate, on_change=on_change,
                          on_storage_failed=on_storage_failed)
    link.subscribe(up=worker.link_up)   # an outage's hold ends when the link is back
    return worker
