"""The aiohttp plumbing the reference server and the test peers share: running an app
until SIGTERM, saying its port (0 picks a free port, written atomically to port_file),
and reading a request's JSON object."""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Awaitable, Callable

from aiohttp import web


CUT_AFTER_S = 0.5


async def serve_until_stopped(app: web.Application, host: str, port: int,
                              port_file: str | None = None,
                              on_listening: Callable[[int], None] | None = None,
                              drain: Callable[[], Awaitable[None]] | None = None,
                              reuse_port: bool = False) -> None:
    """``drain``: on SIGTERM, the listener is closed first (a new connection goes to
    another node: SO_REUSEPORT's sibling, the balancer's other node), and the open ones
    are served until it returns. ``reuse_port``: SO_REUSEPORT, so a second process can
    take over the port (a deploy on one host)."""
    # what is still open once the drain is over (a client that does not know
    # server:drain) is cut, as a process that stops cuts it: aiohttp's shutdown would
    # otherwise wait 60 s for each open websocket's handler, the connection neither
    # served nor closed. Cut at the transport, not with a Socket.IO DISCONNECT, after
    # which a stock client never reconnects. aiohttp waits it twice: for the handler,
    # then for it to end once cancelled.
    try:
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=CUT_AFTER_S)
        site_args: dict = {}
    except TypeError:   # aiohttp before 3.9: the site's
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        site_args = {"shutdown_timeout": CUT_AFTER_S}
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None,
                       **site_args)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    if on_listening is not None:
        on_listening(bound)
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(bound))
        os.replace(tmp, port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if drain is not None:
        server = site._server
        if server is not None:
            server.close()   # the listener only: the open connections stay
        await drain()
    await runner.cleanup()


async def read_json(request: web.Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body
