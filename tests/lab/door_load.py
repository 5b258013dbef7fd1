"""A steady load of short requests at the door from clients that never retry, run in the head's network namespace
with this checkout's venv (`ip netns exec head .venv/bin/python tests/lab/door_load.py HOST PORT MODEL THREADS
[PAUSE_S]`), the client key in DSV41_KEY. Each thread sends one short chat completion after another (max_tokens 4;
PAUSE_S apart, 0 by default) on a new connection each: a refused connection, a reset, a timeout or any answer but
200 is a failure, never tried again.

On stdin: `mark` (prints `marked`) notes the moment a fault is made; `end` stops the load and prints one JSON line:
{"requests", "failed", "refused", "after", "failed_after", "codes": {code: n}, "failures": [the first 10]}: after and
failed_after count the requests begun after the mark."""
import http.client
import json
import os
import sys
import threading
import time

HOST, PORT, MODEL, THREADS = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
PAUSE_S = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
KEY = os.environ["DSV41_KEY"]
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
stop, lock, mark = threading.Event(), threading.Lock(), [None]
done = []           # (began, code or error word)


def one():
    began = time.monotonic()
    conn = http.client.HTTPConnection(HOST, PORT, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", BODY, {"Authorization": f"Bearer {KEY}",
                                                              "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        code = str(r.status)
    except ConnectionRefusedError:
        code = "refused"
    except Exception as err:  # noqa: BLE001 - every way a request can fail is a failure
        code = type(err).__name__
    finally:
        conn.close()
    with lock:
        done.append((began, code))


def client():
    while not stop.is_set():
        one()
        stop.wait(PAUSE_S)


threads = [threading.Thread(target=client, daemon=True) for _ in range(THREADS)]
for t in threads:
    t.start()
for line in sys.stdin:
    if line.strip() == "mark":
        mark[0] = time.monotonic()
        print("marked", flush=True)
    elif line.strip() == "end":
        break
stop.set()
for t in threads:
    t.join(timeout=130)
with lock:
    got = list(done)
after = [c for b, c in got if mark[0] is not None and b >= mark[0]]
codes = {}
for _, c in got:
    codes[c] = codes.get(c, 0) + 1
print(json.dumps({"requests": len(got), "failed": sum(c != "200" for _, c in got),
                  "refused": sum(c == "refused" for _, c in got), "after": len(after),
                  "failed_after": sum(c != "200" for c in after), "codes": codes,
                  "failures": [c for _, c in got if c != "200"][:10]}), flush=True)
