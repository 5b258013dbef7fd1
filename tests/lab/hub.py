"""The Hub stand-in (tests/hubstub.py) serving one directory as the model repo, for the lab's real
engine: `doit download` fetches the tiny model from it as it would the 462 GB checkpoint from the Hub.

    python hub.py REPO_DIR --endpoint-file FILE     (runs until stopped; FILE gets the endpoint URL)
"""
import argparse
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from hubstub import HubStub  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo_dir")
    ap.add_argument("--endpoint-file", required=True)
    a = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with HubStub(a.repo_dir) as hub:
        tmp = a.endpoint_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(hub.endpoint + "\n")
        os.replace(tmp, a.endpoint_file)
        print(f"Hub stand-in for {hub.repo} at {hub.endpoint}, files from {a.repo_dir}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
