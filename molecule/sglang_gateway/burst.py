"""N connections at once through the front door at a given moment (argv: url, N, at: seconds since the epoch), each
asking GET /health; SSL_CERT_FILE names the CA of an HTTPS gateway. Prints one JSON line: how long each took, from
that moment to its answer's status line (None: no answer), and the statuses."""
import asyncio
import json
import ssl
import sys
import time
import urllib.parse

url, count, at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
u = urllib.parse.urlsplit(url)
context = ssl.create_default_context() if u.scheme == 'https' else None


async def one():
    try:
        reader, writer = await asyncio.open_connection(u.hostname, u.port, ssl=context)
        writer.write('GET /health HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n'.format(u.hostname).encode())
        await writer.drain()
        line = await reader.readline()
        if not line:
            raise ConnectionError('closed without an answer')
        took = time.time() - at
        writer.close()
        status = int(line.split()[1])
    except (OSError, ssl.SSLError, IndexError, ValueError) as e:
        return None, 0, '{0:.3f} s: {1!r}'.format(time.time() - at, e)
    return took, status, None


async def main():
    await asyncio.sleep(max(0.0, at - time.time()))
    return await asyncio.gather(*[one() for _ in range(count)])

results = asyncio.run(main())
print(json.dumps({'seconds': [t for t, _, _ in results], 'statuses': [s for _, s, _ in results],
                  'errors': [e for _, _, e in results if e]}))
