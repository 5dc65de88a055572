"""The aiohttp plumbing the reference server and the test peers share: running an app
until SIGTERM, saying its port (0 picks a free port, written atomically to port_file),
and reading a request's JSON object."""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Callable

from aiohttp import web


async def serve_until_stopped(app: web.Application, host: str, port: int,
                              port_file: str | None = None,
                              on_listening: Callable[[int], None] | None = None) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
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
    await runner.cleanup()


async def read_json(request: web.Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body
