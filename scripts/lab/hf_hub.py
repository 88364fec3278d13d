#!/usr/bin/env python3
"""Lab stand-in for the Hugging Face hub (nothing here reaches huggingface.co): serves model repositories from a
directory over the part of the hub's HTTP API that huggingface_hub's snapshot_download and model_info use.

    hf_hub.py ROOT [--host 127.0.0.1] [--port 0] [--token T] [--cut-after BYTES] [--corrupt PATH]

ROOT/<org>/<name>/ is one repository at one revision: its commit sha is derived from the files' contents (sha1 of
the listing), so a changed file is a new revision. Point a client at it with HF_ENDPOINT=http://host:port.

- GET  /api/models/<org>/<name>/revision/<rev>[?blobs=true]: id, sha, siblings (with size, blobId and, for LFS
  files, lfs.sha256 / size: *.safetensors, *.bin and files over 1 MiB are LFS, as on the hub);
- HEAD/GET /<org>/<name>/resolve/<rev>/<path>: X-Repo-Commit, ETag (the sha256 for LFS files, the git blob sha
  otherwise), X-Linked-Size / Content-Length, Range requests (206), no Xet headers (plain HTTP download).
- <rev> is the commit sha or "main"; anything else is 404 with the hub's X-Error-Code RevisionNotFound, an unknown
  repository 404 RepoNotFound, a missing file 404 EntryNotFound.
- --token: every request needs `Authorization: Bearer T` (401 otherwise, as a gated repository).
- --cut-after N: the first GET of each LFS file is cut after N bytes (the connection dropped mid-download), so
  clients must resume with Range; every GET's range is logged to stdout.
- --corrupt PATH: that file is served with its first bytes flipped while the listing keeps its real sha256 (a
  broken mirror or disk): clients that check the hub's sha256 must refuse it.
The port it listens on is printed first ("hf-hub listening on http://127.0.0.1:PORT").
"""
import argparse
import asyncio
import hashlib
import os
import sys

LFS_SUFFIXES = ('.safetensors', '.bin', '.pt', '.gguf')
LFS_MIN = 1024 * 1024


def is_lfs(path, size):
    return path.endswith(LFS_SUFFIXES) or size > LFS_MIN


def git_blob_sha(data):
    return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()


class Repo(object):
    def __init__(self, path):
        self.path = path
        self.files = {}
        for top, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(top, name)
                rel = os.path.relpath(full, path)
                with open(full, 'rb') as fh:
                    data = fh.read()
                lfs = is_lfs(rel, len(data))
                self.files[rel] = {'size': len(data), 'sha256': hashlib.sha256(data).hexdigest(),
                                   'blob': git_blob_sha(data), 'lfs': lfs, 'full': full}
        listing = ''.join('{0} {1}\n'.format(k, v['sha256']) for k, v in sorted(self.files.items()))
        self.sha = hashlib.sha1(listing.encode()).hexdigest()


def build_app(root, token=None, cut_after=None, corrupt=None):
    from aiohttp import web
    cut_done = set()

    def repo_of(org, name):
        path = os.path.join(root, org, name)
        return Repo(path) if os.path.isdir(path) and '..' not in (org, name) else None

    def error(status, code, message):
        return web.json_response({'error': message}, status=status, headers={'X-Error-Code': code,
                                                                             'X-Error-Message': message})

    @web.middleware
    async def auth(request, handler):
        if token and request.headers.get('Authorization') != 'Bearer ' + token:
            return web.json_response({'error': 'Invalid credentials in Authorization header'}, status=401,
                                     headers={'X-Error-Code': 'GatedRepo', 'X-Error-Message': 'Access restricted'})
        return await handler(request)

    def resolve_revision(repo, rev):
        return rev in (repo.sha, 'main')

    async def info(request):
        org, name, rev = request.match_info['org'], request.match_info['name'], request.match_info.get('rev', 'main')
        repo = repo_of(org, name)
        if repo is None:
            return error(404, 'RepoNotFound', 'Repository not found')
        if not resolve_revision(repo, rev):
            return error(404, 'RevisionNotFound', 'Invalid rev id: {0}'.format(rev))
        blobs = request.query.get('blobs') == 'true'
        siblings = []
        for rel, f in sorted(repo.files.items()):
            s = {'rfilename': rel}
            if blobs:
                s.update(size=f['size'], blobId=f['blob'])
                if f['lfs']:
                    s['lfs'] = {'sha256': f['sha256'], 'size': f['size'], 'pointerSize': 134}
            siblings.append(s)
        return web.json_response({'_id': repo.sha[:24], 'id': '{0}/{1}'.format(org, name), 'modelId':
                                  '{0}/{1}'.format(org, name), 'sha': repo.sha, 'private': False, 'gated': bool(token),
                                  'disabled': False, 'downloads': 0, 'likes': 0, 'tags': [], 'siblings': siblings,
                                  'lastModified': '2026-05-20T00:00:00.000Z', 'createdAt': '2026-05-01T00:00:00.000Z'})

    async def resolve(request):
        org, name, rev, path = (request.match_info[k] for k in ('org', 'name', 'rev', 'path'))
        repo = repo_of(org, name)
        if repo is None:
            return error(404, 'RepoNotFound', 'Repository not found')
        if not resolve_revision(repo, rev):
            return error(404, 'RevisionNotFound', 'Invalid rev id: {0}'.format(rev))
        f = repo.files.get(path)
        if f is None:
            return error(404, 'EntryNotFound', 'Entry not found')
        headers = {'X-Repo-Commit': repo.sha, 'ETag': '"{0}"'.format(f['sha256'] if f['lfs'] else f['blob']),
                   'Accept-Ranges': 'bytes', 'Content-Type': 'application/octet-stream'}
        if f['lfs']:
            headers['X-Linked-Etag'] = headers['ETag']
            headers['X-Linked-Size'] = str(f['size'])
        if request.method == 'HEAD':
            headers['Content-Length'] = str(f['size'])
            return web.Response(status=200, headers=headers)
        with open(f['full'], 'rb') as fh:
            data = fh.read()
        if corrupt and path == corrupt:
            data = bytes(b ^ 0x55 for b in data[:64]) + data[64:]
        start, status = 0, 200
        rng = request.headers.get('Range', '')
        if rng.startswith('bytes='):
            first = rng[len('bytes='):].split('-')[0]
            start, status = int(first or 0), 206
            headers['Content-Range'] = 'bytes {0}-{1}/{2}'.format(start, len(data) - 1, len(data))
        print('GET {0}/{1}/{2} range={3}'.format(org, name, path, rng or '-'), flush=True)
        body = data[start:]
        if cut_after is not None and f['lfs'] and path not in cut_done and len(body) > cut_after:
            cut_done.add(path)
            resp = web.StreamResponse(status=status, headers=dict(headers, **{'Content-Length': str(len(body))}))
            await resp.prepare(request)
            await resp.write(body[:cut_after])
            request.transport.close()          # the connection drops mid-file
            return resp
        return web.Response(status=status, body=body, headers=headers)

    app = web.Application(middlewares=[auth])
    app.router.add_get('/api/models/{org}/{name}', info)
    app.router.add_get('/api/models/{org}/{name}/revision/{rev}', info)
    app.router.add_route('HEAD', '/{org}/{name}/resolve/{rev}/{path:.+}', resolve)
    app.router.add_get('/{org}/{name}/resolve/{rev}/{path:.+}', resolve, allow_head=False)
    return app


async def serve(args):
    from aiohttp import web
    runner = web.AppRunner(build_app(args.root, args.token, args.cut_after, args.corrupt), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    print('hf-hub listening on http://{0}:{1}'.format(args.host, port), flush=True)
    await asyncio.Event().wait()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('root')
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=0)
    parser.add_argument('--token')
    parser.add_argument('--cut-after', type=int)
    parser.add_argument('--corrupt')
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):        # every repository would answer 404 RepoNotFound
        parser.error('root: {0} is not a folder'.format(args.root))
    if not 0 <= args.port <= 65535:
        parser.error('--port: 0 to 65535, got {0}'.format(args.port))
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
