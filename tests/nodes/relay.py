"""TCP relay LISTEN_IP:PORT -> 127.0.0.1:PORT, for the real-nodes tier (tier.sh).

The test control planes serve only on 127.0.0.1; a pod reaches the API server through the
`kubernetes` Service, whose endpoint the tier points at the node's host-side address, where this
relay listens. What a real cluster's network gives for free.
"""

import asyncio
import sys


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(listen_ip, port):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, listen_ip, port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
