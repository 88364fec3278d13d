"""N chat completions at once through the gateway (argv: url, N, [kill-after-seconds pidfile]); the fleet key on
stdin. Prints one JSON line: the status of each request (0: no answer), and when the engine was killed."""
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

url, count = sys.argv[1], int(sys.argv[2])
key = sys.stdin.read().strip()
statuses, started = [None] * count, time.time()


def ask(i):
    body = json.dumps({'model': 'glm-5', 'messages': [{'role': 'user', 'content': 'What is 17 + 25?'}],
                       'max_tokens': 48, 'ignore_eos': True}).encode()
    req = urllib.request.Request(url + '/v1/chat/completions', body, {'Authorization': 'Bearer ' + key,
                                                                     'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            statuses[i] = resp.status
    except urllib.error.HTTPError as err:
        statuses[i] = err.code
    except OSError:
        statuses[i] = 0


threads = [threading.Thread(target=ask, args=(i,)) for i in range(count)]
for t in threads:
    t.start()
killed = None
if len(sys.argv) > 4:
    time.sleep(float(sys.argv[3]))
    subprocess.run(['start-stop-daemon', '--stop', '--retry=KILL/5', '--remove-pidfile', '--pidfile=' + sys.argv[4]],
                   check=True, capture_output=True)
    killed = round(time.time() - started, 2)
for t in threads:
    t.join()
print(json.dumps({'statuses': statuses, 'killed_at': killed, 'seconds': round(time.time() - started, 2)}))
