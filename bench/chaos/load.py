"""The soak's load: a few concurrent streams of short chat requests, each with a deadline on its whole
duration (dsv41.client.api.Client.stream), for as long as the soak runs. Every request is recorded:
started and ended (wall clock, comparable with the head's incidents), outcome, tokens, error.

Outcomes: "ok" (a token came back and the answer ended), "failed fast" (refused, broken, or no token
before the deadline without an error status), "error status" (HTTP >= 400 or an error event),
"deadline" (cut at its deadline)."""
import ctypes
import os
import threading
import time

from dsv41.client.api import ApiError, Client
from dsv41.errors import UserError, one_line

OK, FAILED_FAST, ERROR, DEADLINE = "ok", "failed fast", "error status", "deadline"
OUTCOMES = (OK, FAILED_FAST, ERROR, DEADLINE)
CLONE_NEWNET = 0x40000000


def enter_netns(name):
    """Move the calling thread (only it) into the network namespace /run/netns/NAME."""
    if not name:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name} failed")
    finally:
        os.close(fd)


def one_request(client, body, deadline_s):
    """One request: a record {started, ended, outcome, tokens, error}."""
    rec = {"started": time.time(), "outcome": None, "tokens": 0, "error": None}
    try:
        s = client.stream("/chat/completions", body, deadline_s=deadline_s)
        rec["tokens"] = len(s.token_times)
        if s.timed_out:
            rec["outcome"] = DEADLINE
        elif s.t_first is not None:
            rec["outcome"] = OK
        else:
            rec["outcome"], rec["error"] = FAILED_FAST, "the answer ended with no token"
    except ApiError as err:
        rec["outcome"], rec["error"] = ERROR, one_line(err, 160)
    except UserError as err:
        rec["outcome"], rec["error"] = FAILED_FAST, one_line(err, 160)
    except Exception as err:  # noqa: BLE001  any other break is a failed request, recorded
        rec["outcome"], rec["error"] = FAILED_FAST, f"{type(err).__name__}: {one_line(err, 140)}"
    rec["ended"] = time.time()
    return rec


class Load:
    def __init__(self, url, key, model, streams=3, deadline_s=30.0, pause_s=0.3, netns="head",
                 prompt="count to 20", max_tokens=32):
        self.client = Client(url, key, read_timeout=deadline_s)
        self.body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]}
        self.streams, self.deadline_s, self.pause_s, self.netns = streams, deadline_s, pause_s, netns
        self.records, self.lock, self.stopping = [], threading.Lock(), threading.Event()
        self.in_flight = {}             # thread index -> started, while a request runs
        self.threads = []

    def start(self):
        for i in range(self.streams):
            t = threading.Thread(target=self.run, args=(i,), name=f"load-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def run(self, i):
        enter_netns(self.netns)
        while not self.stopping.is_set():
            self.in_flight[i] = time.time()
            rec = one_request(self.client, self.body, self.deadline_s)
            self.in_flight.pop(i, None)
            with self.lock:
                self.records.append(rec)
            self.stopping.wait(self.pause_s if rec["outcome"] == OK else max(self.pause_s, 1.0))

    def stop(self):
        """Stop asking; every request in flight ends by its deadline. Returns the requests still
        running past their deadline (hung), as records with no end."""
        self.stopping.set()
        for t in self.threads:
            t.join(self.deadline_s + 10)
        return [{"started": s, "ended": None, "outcome": "hung", "tokens": 0,
                 "error": "still running past its deadline"} for s in self.in_flight.values()]

    def snapshot(self):
        with self.lock:
            return list(self.records)

    def first_ok_since(self, t):
        """End time of the first ok request that started at or after t, or None."""
        ends = [r["ended"] for r in self.snapshot() if r["outcome"] == OK and r["started"] >= t]
        return min(ends) if ends else None


def served_model(url, key, netns="head"):
    """The first model the API lists, asked from inside the network namespace."""
    box = {}

    def ask():
        try:
            enter_netns(netns)
            box["models"] = Client(url, key, read_timeout=30).models()
        except Exception as err:  # noqa: BLE001  reported below
            box["error"] = err
    t = threading.Thread(target=ask)
    t.start()
    t.join(60)
    if not box.get("models"):
        raise UserError(f"{url}/models listed no model: {box.get('error', 'no answer')}")
    return box["models"][0]
