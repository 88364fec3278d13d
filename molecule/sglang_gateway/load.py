"""N chat completions at once through the gateway (argv: url, N, [kill-after-seconds pidfile]), or N clients asking
again and again for a while - SECONDS, or until STOP_FILE exists -, beside one long answer asked at the start (argv:
url, N, for, SECONDS, [LONG_TOKENS, [STOP_FILE]]); the fleet key on stdin. Prints one JSON line: the status of each
request (0: no answer), when the engine was killed, the long answer's status and tokens, and whether the clients
stopped for STOP_FILE (not for SECONDS)."""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

url, count = sys.argv[1], int(sys.argv[2])
key = sys.stdin.read().strip()
for_seconds = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == 'for' else None
statuses, started = ([] if for_seconds is not None else [None] * count), time.time()


long_tokens = int(sys.argv[5]) if for_seconds is not None and len(sys.argv) > 5 else 0
stop_file = sys.argv[6] if for_seconds is not None and len(sys.argv) > 6 else None
long_answer = {}


def ask(tokens=48):
    body = json.dumps({'model': 'glm-5', 'messages': [{'role': 'user', 'content': 'What is 17 + 25?'}],
                       'max_tokens': tokens, 'ignore_eos': True}).encode()
    req = urllib.request.Request(url + '/v1/chat/completions', body, {'Authorization': 'Bearer ' + key,
                                                                     'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            got = json.load(resp)
            return resp.status, got.get('usage', {}).get('completion_tokens')
    except urllib.error.HTTPError as err:
        return err.code, None
    except OSError:
        return 0, None


def long_one():
    long_answer['status'], long_answer['tokens'] = ask(long_tokens)
    long_answer['seconds'] = round(time.time() - started, 2)


def once(i):
    statuses[i] = ask()[0]


def again_and_again(_i):
    while time.time() - started < for_seconds and not (stop_file and os.path.exists(stop_file)):
        statuses.append(ask()[0])          # list.append: one call, safe across threads
        if statuses[-1] != 200:
            time.sleep(0.1)                # a client's pause before it asks again


threads = [threading.Thread(target=once if for_seconds is None else again_and_again, args=(i,)) for i in range(count)]
if long_tokens:
    threads.append(threading.Thread(target=long_one))
for t in threads:
    t.start()
killed = None
if len(sys.argv) > 4 and for_seconds is None:
    time.sleep(float(sys.argv[3]))
    subprocess.run(['start-stop-daemon', '--stop', '--retry=KILL/5', '--remove-pidfile', '--pidfile=' + sys.argv[4]],
                   check=True, capture_output=True)
    killed = round(time.time() - started, 2)
for t in threads:
    t.join()
print(json.dumps({'statuses': statuses, 'killed_at': killed, 'seconds': round(time.time() - started, 2),
                  'long': long_answer, 'stopped_by_file': bool(stop_file and os.path.exists(stop_file))}))
