"""The commands, assembled: what each command does (actions.py) and the service that
takes the server's commands off the link's port, runs them on its own thread over the
core and the ledger, and sends their results back (service.py). The daemon builds it
on the link's port, after the parts its commands act on."""
from __future__ import annotations

import time
from typing import Callable

from ..config.model import Config
from ..runtime.watchdog_gate import WatchdogGate
from .actions import Actions, NotQueued
from .core import Outcome
from .service import CommandService

__all__ = ["NotQueued", "assemble"]


def assemble(config: Config, link, *, screen, updater, configure: Callable,
             snapshot: Callable[[], dict], enqueue: Callable[[str, bytes], str],
             request_restart: Callable[[], None], storage_error: Callable,
             on_change: Callable[[], None], gate: WatchdogGate | None) -> CommandService:
    """``link``: the link part (link/part.py): its port, its profile's words, the live
    socket and the server's clock; ``screen``: the screen part, the one owner of the
    display's power, its controls and its screenshot."""
    profile, clock = link.profile, link.server_clock
    actions = Actions(
        config.commands, config.server.url, snapshot=snapshot,
        link_socket=link.runner.raw_socket, request_restart=request_restart,
        enqueue=enqueue, updater=updater, configure=configure,
        undeliverable=link.enqueue_problem, power=screen.power, controls=screen.controls,
        server_far=lambda t: clock.far(t, time.monotonic()), shoot=screen.screenshot)
    service = CommandService(
        config.commands_path, config.commands.allow, actions, config.runtime.dir,
        link=link.port, result_message=profile.command_result,
        ids_ours=type(profile).pairs_in_link, on_storage_error=storage_error,
        on_change=on_change, gate=gate, server_now=clock.now)
    updater.subscribe(settled(service))   # a self-update's order settles at a later start
    return service


def settled(commands: CommandService) -> Callable[[str, bool, str], None]:
    """What a command's later end (a self-update's, settled at the next start) does:
    its result, recorded and sent as any other."""
    def done(command_id: str, ok: bool, text: str) -> None:
        outcome = Outcome(True, text) if ok else Outcome(False, error=text)
        commands.finished(command_id, outcome, time.time())   # which refreshes
    return done
