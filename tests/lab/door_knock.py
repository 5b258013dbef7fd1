"""A client that opens a new connection to the door every INTERVAL seconds for SECONDS seconds, each on its
own thread (one that waits does not hold back the next), each asking `GET /health` (no key): what a client
sees while HAProxy dies and comes back. Standard library only; run in the head's network namespace in the lab
(tests/lab/test_lab_gateway.py), or beside a local HAProxy (tests/test_gateway.py):

    python3 door_knock.py HOST PORT SECONDS INTERVAL

prints one JSON line: {"opened": N, "answers": {kind: count}, "slowest_s": s}. Kinds: an HTTP status ("200",
"503"); "refused" (the connection itself was refused: nothing held the port); "cut: <error>" (connected, then
closed or reset unanswered: a request in flight in a process that died); "timeout" (no answer within 30 s)."""
import json
import socket
import sys
import threading
import time

REQUEST = b"GET /health HTTP/1.1\r\nHost: door\r\nConnection: close\r\n\r\n"


def knock(host, port):
    """(kind, seconds) of one connection."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(REQUEST)
            head = b""
            while len(head) < 12:
                data = s.recv(12 - len(head))
                if not data:
                    break
                head += data
        kind = head[9:12].decode() if head.startswith(b"HTTP/1.") and len(head) >= 12 else "cut: closed unanswered"
    except ConnectionRefusedError:
        kind = "refused"
    except socket.timeout:
        kind = "timeout"
    except OSError as err:
        kind = f"cut: {type(err).__name__}"
    return kind, time.monotonic() - t0


def run(host, port, seconds, interval):
    answers, slowest, lock, threads = {}, [0.0], threading.Lock(), []

    def one():
        kind, took = knock(host, port)
        with lock:
            answers[kind] = answers.get(kind, 0) + 1
            slowest[0] = max(slowest[0], took)
    end, at = time.monotonic() + seconds, time.monotonic()
    while at < end:
        threads.append(threading.Thread(target=one))
        threads[-1].start()
        at += interval
        time.sleep(max(0.0, at - time.monotonic()))
    for t in threads:
        t.join(60)
    return {"opened": len(threads), "answers": answers, "slowest_s": round(slowest[0], 3)}


if __name__ == "__main__":
    host, port, seconds, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    print(json.dumps(run(host, port, seconds, interval)), flush=True)
