"""Another run at the same time, as a second operator's would be: waits until node A is out of the gateway (its
leave), then takes node B out through the control plane - after A checked that B serves, before A's check of the
list after its removal. argv: gateway URL, A's worker URL, B's worker URL, seconds to wait at most; the admin key on
stdin; the CA in SSL_CERT_FILE. Prints one JSON line: whether and when B was taken out."""
import json
import sys
import time
import urllib.request

url, a, b, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
headers = {'Authorization': 'Bearer ' + sys.stdin.read().strip()}


def call(method, path):
    req = urllib.request.Request(url + path, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b'null')


t0, out = time.time(), {'removed': False}
while time.time() - t0 < wait:
    workers = call('GET', '/workers')['workers']
    if not any(w['url'] == a and w.get('is_healthy') for w in workers):
        for w in workers:
            if w['url'] == b:
                call('DELETE', '/workers/' + w['id'])
                out = {'removed': True, 'after_s': round(time.time() - t0, 1)}
        break
    time.sleep(0.2)
print(json.dumps(out))
