"""A TCP forwarder that delays every byte by a fixed time in each direction: a link with
that one-way latency, for a kernel without tc's netem (tests/netem/run.sh). Order and
contents are kept; throughput is bounded by this process, which the baseline shares.

    /usr/bin/python3 delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS [...]

Several LISTEN TARGET DELAY triples may follow one another. Prints "proxying" once every
listener is up; runs until killed.
"""
import asyncio
import sys
import time


async def pipe(reader, writer, delay):
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 20)
            if not data:
                break
            queue.put_nowait((time.monotonic() + delay, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((0.0, None))
    try:
        await sender
    except (ConnectionError, OSError):
        pass


def split(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def main(triples):
    servers = []
    for listen, target, delay_ms in triples:
        delay = float(delay_ms) / 1000.0
        target_host, target_port = split(target)

        async def handle(reader, writer, target_host=target_host, target_port=target_port,
                         delay=delay):
            try:
                up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer, delay), pipe(up_reader, writer, delay))

        host, port = split(listen)
        servers.append(await asyncio.start_server(handle, host, port, limit=1 << 20))
    print("proxying", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 3:
        sys.exit("usage: delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS [...]")
    asyncio.run(main([args[i:i + 3] for i in range(0, len(args), 3)]))
