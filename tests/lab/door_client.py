"""A client of the lab's door, with the official `openai` SDK, run in the head's network namespace from the
checkout's venv (`ip netns exec head .venv/bin/python tests/lab/door_client.py`): what a user's tool sees.

Until a line arrives on stdin it asks /v1/models every 0.2 s (max_retries=0: every answer counted), and
each `stream N` line on stdin starts a streamed completion ("count to N"; `stream N exact`: exactly N tokens,
the end token ignored, as vLLM allows). At EOF (or `end`) it prints one
JSON line: the answers by kind ("200", "503 retry-after 5", "refused", ...), and each stream's start time
and whether it ended whole. The key comes from the environment (DSV41_KEY), never argv."""
import json
import os
import sys
import threading
import time

import openai

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
MODEL = "deepseek-v4.1-flash"


def client():
    return openai.OpenAI(base_url=URL, api_key=os.environ["DSV41_KEY"], max_retries=0, timeout=30)


def kind(fn):
    try:
        fn()
        return "200"
    except openai.APIStatusError as err:
        return f"{err.status_code} retry-after {err.response.headers.get('retry-after')}"
    except openai.APIConnectionError as err:
        cause = err.__cause__ or err
        return "refused" if "refused" in str(cause).lower() else f"connection error: {type(cause).__name__}"


def main():
    answers, streams, done = {}, [], threading.Event()
    lock = threading.Lock()

    def ask():
        while not done.is_set():
            k = kind(lambda: client().models.list())
            with lock:
                answers[k] = answers.get(k, 0) + 1
            time.sleep(0.2)

    def stream(n, exact):
        rec = {"started": time.time(), "whole": False, "text_len": 0, "chunks": 0}
        streams.append(rec)
        size = {"max_tokens": n, "extra_body": {"ignore_eos": True}} if exact else {"max_tokens": 4 * n}
        try:
            out = client().completions.create(model=MODEL, prompt=f"count to {n}", stream=True, **size)
            for chunk in out:
                rec["text_len"] += len(chunk.choices[0].text or "") if chunk.choices else 0
                rec["chunks"] += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    rec["whole"] = chunk.choices[0].finish_reason in ("stop", "length")
        except Exception as err:  # noqa: BLE001 - a cut stream, whatever cut it
            rec["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        rec["ended"] = time.time()

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    threads = []
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["stream"]:
            threads.append(threading.Thread(target=stream, args=(int(words[1]), words[2:] == ["exact"])))
            threads[-1].start()
            print("started", flush=True)
        elif words[:1] == ["end"]:
            break
    done.set()
    for t in threads:
        t.join(120)
    asker.join(30)
    print(json.dumps({"answers": answers, "streams": streams}), flush=True)


if __name__ == "__main__":
    main()
