"""Smoke test of a running OpenAI-compatible API: text, tools, vision, reasoning, stream.

python -m dsv41.client.smoke URL [--model M] [--key-file F] [--tool-choice auto|named]
                              [--request-timeout-s S] [--deadline-s S] [--json]
No request carries an output cap: every answer ends naturally, or fails its check when it takes longer
than --request-timeout-s (default 600). The whole run ends within --deadline-s (default 1800): the
checks still to run when it passes fail at once.

Exit 0 when no check failed, 1 when one did, 2 (one line on stderr) for bad input: an option, the key
file, the key rejected, or a model not among those /v1/models lists; 3 (one line) when the server
cannot be used: not reachable, no answer in time, or not an OpenAI-compatible answer.
--json prints one object (schema "dsv41.smoke/1"): {"schema": str, "url": str, "model": str or null,
"ok": bool, "error": str or null, "checks": [{"check": str, "status": "PASS"|"FAIL"|"SKIP",
"evidence": str}]}; checks are in the order text, tools, vision, reasoning, stream; when error is set,
they are the checks that ran, the last one FAIL with the error."""
import argparse
import base64
import json
import struct
import sys
import zlib

from dsv41.client.api import (DEFAULT_KEY_FILE, ApiError, Client, RunDeadline, TimedOut, check_request_timeout,
                              load_key)
from dsv41.errors import UserError, cli, one_line

SCHEMA = "dsv41.smoke/1"
REQUEST_TIMEOUT_S = 600
DEADLINE_S = 1800
CHECKS = ("text", "tools", "vision", "reasoning", "stream")
TEXT_PROMPT = "What is 17 * 23? Reply with the number."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]},
    },
}


def png(width, height, rgb):
    """A truecolour PNG built with zlib/struct from raw RGB bytes (row after row)."""
    stride = width * 3
    rows = b"".join(b"\x00" + bytes(rgb[y * stride:(y + 1) * stride]) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def red_blue_png(width=256, height=128):
    row = bytes((220, 20, 20)) * (width // 2) + bytes((20, 40, 220)) * (width - width // 2)
    return png(width, height, row * height)


def tail(text, n=80):
    text = one_line(text or "", 10_000)
    return repr(text if len(text) <= n else "..." + text[-n:])


def usage_str(usage):
    if not isinstance(usage, dict) or not usage:
        return "usage: none"
    return f"usage: prompt {usage.get('prompt_tokens', '?')} completion {usage.get('completion_tokens', '?')}"


def _message(resp):
    """The first choice's message and finish reason; an empty message when the answer has none."""
    choices = resp.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    msg = choice.get("message")
    return msg if isinstance(msg, dict) else {}, choice.get("finish_reason")


def _str(value):
    """A message field as text: a server may send null, a number or a list where a string belongs."""
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)


def _reasoning_of(msg):
    return _str(msg.get("reasoning_content") or msg.get("reasoning"))


def check_text(client, model, ctx):
    body = {"model": model, "messages": [{"role": "user", "content": TEXT_PROMPT}], "temperature": 0}
    resp = client.post_json("/chat/completions", body)
    msg, finish = _message(resp)
    content = _str(msg.get("content"))
    ctx["text"] = content
    ctx["reasoning"] = _reasoning_of(msg)
    ok = "391" in content
    return ok, f"answer {tail(content)} (want 391), finish {finish}, {usage_str(resp.get('usage'))}"


def check_tools(client, model, ctx, tool_choice="auto"):
    choice = "auto" if tool_choice == "auto" else {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": model, "temperature": 0, "tools": [WEATHER_TOOL], "tool_choice": choice,
            "messages": [{"role": "user", "content": "What is the weather like in Warsaw right now? Use the tool."}]}
    resp = client.post_json("/chat/completions", body)
    msg, finish = _message(resp)
    calls = msg.get("tool_calls")
    if not (isinstance(calls, list) and calls and isinstance(calls[0], dict)):
        return False, (f"no tool call; answer {tail(_str(msg.get('content')))}, finish {finish}, "
                       f"{usage_str(resp.get('usage'))}")
    fn = calls[0].get("function") if isinstance(calls[0].get("function"), dict) else {}
    name, raw = fn.get("name"), fn.get("arguments")
    try:
        args = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except ValueError:
        args = None
    city = args.get("city") if isinstance(args, dict) else None
    ok = name == "get_weather" and isinstance(city, str) and city.strip().lower().startswith("warsaw")
    return ok, f"call {name}({one_line(str(raw), 120)}) (want get_weather city=Warsaw), {usage_str(resp.get('usage'))}"


def check_vision(client, model, ctx):
    url = "data:image/png;base64," + base64.b64encode(red_blue_png()).decode()
    body = {"model": model, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "This image has two halves. Name the colour of the left half, then the colour "
                                 "of the right half, in that order, one word each."},
        {"type": "image_url", "image_url": {"url": url}}]}]}
    try:
        resp = client.post_json("/chat/completions", body)
    except ApiError as err:
        return False, f"image request refused: {err}"
    msg, finish = _message(resp)
    content = _str(msg.get("content"))
    low = content.lower()
    r, b = low.find("red"), low.find("blue")
    ok = r >= 0 and b >= 0 and r < b
    return ok, f"answer {tail(content)} (want red before blue), {usage_str(resp.get('usage'))}"


def check_stream(client, model, ctx):
    body = {"model": model, "messages": [{"role": "user", "content": TEXT_PROMPT}], "temperature": 0}
    s = client.stream("/chat/completions", body, deadline_s=client.read_timeout)
    ctx["stream_reasoning"] = s.reasoning
    how = "[DONE]" if s.done else f"finish_reason={s.finish_reason}" if s.finish_reason else "no end marker"
    if s.timed_out:
        how = (f"the run's {client.deadline_s:g} s deadline (--deadline-s)" if client.past_deadline
               else f"the {client.read_timeout:g} s deadline (--request-timeout-s)")
    same = "text" in ctx and s.text == ctx["text"]
    ok = s.ended and not s.timed_out and s.t_first is not None and ("391" in s.text or same)
    match = "same as non-streamed" if same else "differs from non-streamed" if "text" in ctx else "no reference"
    return ok, (f"{s.messages} messages, {s.output_tokens} tokens ({s.tokens_from}), ended by {how}, "
                f"{match}, answer {tail(s.text)}, {usage_str(s.usage)}")


def check_reasoning(client, model, ctx):
    reasoning = ctx.get("reasoning") or ctx.get("stream_reasoning") or ""
    text = ctx.get("text") or ""
    if reasoning:
        return True, f"reasoning {len(reasoning)} chars, tail {tail(reasoning)}"
    if "<think>" in text or "</think>" in text:
        return False, f"reasoning came inline in the answer (no reasoning parser?): {tail(text)}"
    if "text" not in ctx:
        return None, "no answer to inspect (the text check failed to run)"
    return None, "the model sent no reasoning content"


def run_smoke(url, key, model=None, as_json=False, tool_choice="auto", out=None,
              request_timeout_s=REQUEST_TIMEOUT_S, deadline_s=DEADLINE_S):
    """Run every check against URL, one line per check; return the exit code: 0 when no check
    failed, 1 when one did, 2 or 3 (one line on stderr) for bad input or a server that cannot be used."""
    out = out or sys.stdout
    results = []
    try:
        return _run(url, key, model, as_json, tool_choice, out, request_timeout_s, deadline_s, results)
    except UserError as err:
        msg = one_line(err, 2000)
        print(f"dsv41: {msg}", file=sys.stderr)
        if as_json:
            print(json.dumps({"schema": SCHEMA, "url": url, "model": model, "ok": False, "error": msg,
                              "checks": sorted(results, key=lambda r: CHECKS.index(r["check"]))}), file=out)
        return err.exit_code


def _run(url, key, model, as_json, tool_choice, out, request_timeout_s, deadline_s, results):
    client = Client(url, key, read_timeout=request_timeout_s, deadline_s=deadline_s)
    model = client.served_model(model)["id"]  # also proves the URL and key
    ctx = {}
    steps = [("text", check_text), ("tools", lambda c, m, x: check_tools(c, m, x, tool_choice)),
             ("vision", check_vision), ("stream", check_stream), ("reasoning", check_reasoning)]
    for name, fn in steps:
        try:
            ok, evidence = fn(client, model, ctx)
        except TimedOut as err:
            ok, evidence = False, (f"the run's {deadline_s:g} s deadline passed (--deadline-s)"
                                   if isinstance(err, RunDeadline) or client.past_deadline
                                   else f"no answer within {request_timeout_s:g} s (--request-timeout-s)")
        except UserError as err:            # an error status, a broken stream: this check fails
            ok, evidence = False, one_line(err, 500)
            if isinstance(err, ApiError) and err.status in (401, 403):
                results.append({"check": name, "status": "FAIL", "evidence": evidence})
                raise
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        results.append({"check": name, "status": status, "evidence": evidence})
        if not as_json:
            print(f"{name:<9} {status} {evidence}", file=out, flush=True)
    results.sort(key=lambda r: CHECKS.index(r["check"]))
    code = 0 if all(r["status"] != "FAIL" for r in results) else 1
    if as_json:
        print(json.dumps({"schema": SCHEMA, "url": client.base, "model": model, "ok": code == 0, "error": None,
                          "checks": results}), file=out)
    else:
        print(f"smoke     {'PASS' if code == 0 else 'FAIL'} model {model} at {client.base}", file=out)
    return code


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsv41.client.smoke", description=__doc__.splitlines()[0])
    p.add_argument("url", help="API base URL, with or without /v1")
    p.add_argument("--model", help="model name (default: the first id from /v1/models)")
    p.add_argument("--key-file", help=f"API key file when DSV41_API_KEY is unset (default {DEFAULT_KEY_FILE})")
    p.add_argument("--tool-choice", choices=("auto", "named"), default="auto",
                   help="let the model choose the tool (auto) or name get_weather in tool_choice")
    p.add_argument("--request-timeout-s", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
                   help=f"fail a check whose answer takes longer than S seconds (default {REQUEST_TIMEOUT_S})")
    p.add_argument("--deadline-s", type=float, default=DEADLINE_S, metavar="S",
                   help=f"end the whole run within S seconds: checks still to run then fail (default {DEADLINE_S})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines (schema dsv41.smoke/1)")
    a = p.parse_args(argv)
    check_request_timeout(a.request_timeout_s, a.deadline_s)
    return run_smoke(a.url, load_key(a.key_file), a.model, a.json, a.tool_choice,
                     request_timeout_s=a.request_timeout_s, deadline_s=a.deadline_s)


if __name__ == "__main__":
    sys.exit(main())
