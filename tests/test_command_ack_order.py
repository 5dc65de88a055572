"""``server:command`` is ACKed only once the command ledger holds it, durably: an ACK is
the server's signal that the command need not be sent again, so a power cut between an
early ACK and the ledger's write lost the command for good. Before: the library's thread
ACKed as soon as it had posted the command to the link thread."""
from __future__ import annotations

import threading

from agent.commands.actions import Actions
from agent.commands.service import CommandService
from agent.link import inbox
from agent.link.profiles.edge_agent import EdgeAgentProfile
from devtools.harness import wait_for


def test_the_receipt_waits_for_the_link_thread_to_record_the_command():
    posted, answers = [], []
    handler = EdgeAgentProfile(None).handlers(posted.append)["server:command"]
    t = threading.Thread(target=lambda: answers.append(handler(None, {"id": "c1"})))
    t.start()
    t.join(0.3)
    assert t.is_alive() and answers == [], "ACKed before the link thread recorded it"
    [news] = posted
    news.recorded()
    t.join(5)
    assert answers == [{"ok": True}]


def test_the_commands_thread_says_recorded_only_after_the_ledger_is_on_disk(tmp_path):
    ledger = tmp_path / "commands.jsonl"
    seen_on_disk = []
    service = CommandService(str(ledger), frozenset({"diagnostics"}),
                             Actions.__new__(Actions), runtime_dir=str(tmp_path))
    service.actions.updater = None
    service.actions.stop = lambda: None
    service._jobs.put = lambda job: None     # recorded, not run: the order is what counts
    service.start()
    try:
        news = inbox.Request("command", {"id": "cmd-42", "name": "diagnostics", "args": {},
                                         "ttl_s": 300}, "server:command",
                             lambda: seen_on_disk.append(ledger.read_bytes()))
        service.serve(news.raw, news.recorded)
        wait_for(lambda: seen_on_disk, 5, what="recorded()")
    finally:
        service.stop()
        service.loop.join(5)
    assert len(seen_on_disk) == 1 and b"cmd-42" in seen_on_disk[0]
