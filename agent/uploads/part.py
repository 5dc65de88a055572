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
from .store import QueueRefused, QueueStore, QueueUnavailable
from .worker import UploadWorker

__all__ = ["QueueRefused", "QueueUnavailable", "assemble"]


def assemble(policy: UploadPolicy, queue_path: str, *, profile, link: LinkPort, server: Server,
             identity, gate: WatchdogGate | None,
             on_change: Callable[[], None],
             on_storage_failed: Callable[[Exception], None]) -> UploadWorker:
    """The worker over the queue at ``queue_path``; its ``store`` is None where the card
    refused it (``on_storage_failed`` has heard why). ``identity``: the device's
    (identity/part.py): what an HTTP upload carries, and credentials newly stored
    resume the uploads."""
    try:
        store: QueueStore | None = QueueStore(queue_path, policy)
    except (QueueUnavailable, OSError) as e:   # the card, a link planted in the spool
        store = None
        on_storage_failed(e)
    sender = (LinkUploadSender(link, profile) if profile.link_upload_kinds
              else UploadSender(server.url, identity.current, server.egress))
    worker = UploadWorker(store, sender, policy, gate=gate, on_change=on_change,
                          on_storage_failed=on_storage_failed)
    link.subscribe(up=worker.link_up)   # an outage's hold ends when the link is back
    identity.subscribe(resume_uploads=worker.link_up)   # and so does a fresh pairing's
    return worker
