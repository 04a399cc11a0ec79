"""A latency and bandwidth proxy for HTTP on loopback, standing in for a remote object store.

Run as ``python -m stager.slows3.proxy --target PORT [--latency-ms X]
[--mbps Y] [--fault STATUS:COUNT:REGEX ...]``: prints ``port N`` and serves
until its stdin closes. It reads each request whole (head and
``Content-Length`` body) and forwards it ``X`` ms later, so every request,
on however many connections, pays the round trip a remote store would cost;
answers stream back through one bandwidth budget of ``Y`` MB/s shared by all
connections. A fault answers the first ``COUNT`` GETs whose target matches
``REGEX`` (``COUNT`` -1: all) with ``STATUS`` and the store's XML error,
without asking the server.
"""

import argparse
import asyncio
import re
import sys
import time
from dataclasses import dataclass

from .owned import Owned, serve_until_owner_leaves

ERROR_CODES = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError", 503: "SlowDown"}


@dataclass
class Fault:
    """Answer ``count`` GETs matching ``pattern`` with ``status`` (-1: every one)."""

    status: int
    count: int
    pattern: str

    def arg(self):
        return f"{self.status}:{self.count}:{self.pattern}"

    @classmethod
    def parse(cls, text):
        status, count, pattern = text.split(":", 2)
        return cls(int(status), int(count), pattern)


class SlowProxy(Owned):
    """The proxy in a child process, in front of ``127.0.0.1:target_port``, for a ``with`` block.

    Args:
        target_port: The server's loopback port.
        latency_ms: Added to every request.
        mbps: Shared bandwidth of the answers in MB/s; 0: none.
        faults: ``Fault`` rules.
    """

    def __init__(self, target_port, latency_ms=0.0, mbps=0.0, faults=()):
        args = ["--target", str(target_port), "--latency-ms", str(latency_ms), "--mbps", str(mbps)]
        for fault in faults:
            args += ["--fault", fault.arg()]
        super().__init__(__name__, args, "the object store proxy")

    @property
    def endpoint_url(self):
        return f"http://127.0.0.1:{self.port}"


def _error_response(status, target):
    code = ERROR_CODES.get(status, str(status))
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>injected by the proxy</Message><Resource>{target}</Resource></Error>").encode()
    head = (f"HTTP/1.1 {status} {code}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n").encode()
    return head + body


class _Proxy:
    def __init__(self, target_port, latency_ms, mbps, faults):
        self.target_port, self.latency_s = target_port, latency_ms / 1000.0
        self.rate = mbps * 1e6
        self.faults = [(f, re.compile(f.pattern)) for f in faults]
        self.free_at = 0.0  # when the shared link is next free

    def fault_for(self, method, target):
        for fault, pattern in self.faults:
            if method == "GET" and fault.count != 0 and pattern.search(target):
                fault.count -= 1 if fault.count > 0 else 0
                return fault.status
        return None

    async def down(self, upstream, client):
        """Copies the server's answers to the client through the shared bandwidth budget."""
        try:
            while chunk := await upstream.read(1 << 16):
                if self.rate:
                    now = time.monotonic()
                    self.free_at = max(self.free_at, now) + len(chunk) / self.rate
                    await asyncio.sleep(self.free_at - now)
                client.write(chunk)
                await client.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            client.close()

    async def handle(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()  # the server is gone: the client sees the connection drop
            return
        pump = asyncio.ensure_future(self.down(up_reader, writer))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target = lines[0].split(" ")[:2]
                length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                await asyncio.sleep(self.latency_s)
                status = self.fault_for(method, target)
                if status is not None:
                    print(f"injected {status} for {method} {target}", file=sys.stderr, flush=True)
                    writer.write(_error_response(status, target))
                    await writer.drain()
                    continue
                up_writer.write(head + body)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError, ValueError):
            pass
        finally:
            up_writer.close()
            await pump


async def _serve(args):
    proxy = _Proxy(args.target, args.latency_ms, args.mbps, [Fault.parse(f) for f in args.fault])
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, backlog=1024)
    serve_until_owner_leaves(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def main():
    parser = argparse.ArgumentParser(prog="python -m stager.slows3.proxy")
    parser.add_argument("--target", type=int, required=True, help="the server's port on 127.0.0.1")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--mbps", type=float, default=0.0)
    parser.add_argument("--fault", action="append", default=[], metavar="STATUS:COUNT:REGEX")
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
