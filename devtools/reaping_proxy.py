"""A loopback TCP proxy that reaps idle flows the way DPI boxes and SNAT tables do:
after ``--idle-s`` without a byte either way it stops forwarding that flow, silently.
Both sockets stay open; nothing is sent, no FIN, no RST. Prints a JSON line per reap.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


def reap_times(log_path) -> list[float]:
    """Wall times of the reaps this proxy printed to ``log_path``."""
    times = []
    for line in open(log_path, encoding="utf-8", errors="replace"):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "reaped":
            times.append(float(event["t"]))
    return times


async def main_async(args) -> None:
    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", args.target)
        except OSError:
            client_w.close()
            return
        last = [time.monotonic()]
        reaped = asyncio.Event()

        async def pump(reader, writer):
            while not reaped.is_set():
                data = await reader.read(65536)
                if not data:
                    break
                if reaped.is_set():
                    break  # swallowed: the flow is dead to the box
                last[0] = time.monotonic()
                writer.write(data)
                await writer.drain()

        async def reaper():
            while not reaped.is_set():
                await asyncio.sleep(0.1)
                if time.monotonic() - last[0] >= args.idle_s:
                    reaped.set()
                    print(json.dumps({"event": "reaped", "t": time.time()}), flush=True)

        tasks = [asyncio.ensure_future(pump(client_r, server_w)),
                 asyncio.ensure_future(pump(server_r, client_w)),
                 asyncio.ensure_future(reaper())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        if reaped.is_set():
            # keep both ends open and read into the void, so neither side hears a thing
            async def swallow(reader):
                while await reader.read(65536):
                    pass
            await asyncio.gather(swallow(client_r), swallow(server_r), return_exceptions=True)
        client_w.close()
        server_w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with open(args.port_file, "w") as f:
        f.write(str(port))
    async with server:
        await server.serve_forever()


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=int, required=True)
    p.add_argument("--idle-s", type=float, required=True)
    p.add_argument("--port-file", required=True)
    asyncio.run(main_async(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
