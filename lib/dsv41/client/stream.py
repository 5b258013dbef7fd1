"""A streamed answer: the server-sent events read as they arrive (with the quirks servers have: no
blank line between events, a last event without one), and what each chunk adds to the Stream, timed
the way `vllm bench serve` does."""
import json
import time
from dataclasses import dataclass, field


@dataclass
class Stream:
    """One streamed answer, timed the way `vllm bench serve` does (perf_counter seconds)."""

    t_start: float = 0.0
    t_first: float | None = None  # first message carrying a token (a role-only chunk is not one)
    t_last: float | None = None  # last message with choices (a usage-only chunk does not extend it)
    token_times: list = field(default_factory=list)  # arrival of each token-bearing message
    text: str = ""
    reasoning: str = ""
    tool_calls: dict = field(default_factory=dict)  # index -> {"name", "arguments"}
    usage: dict | None = None
    finish_reason: str | None = None
    done: bool = False  # saw `data: [DONE]`
    messages: int = 0
    timed_out: bool = False  # cut at its deadline (finish_reason is then "timeout")

    @property
    def output_tokens(self):
        u = (self.usage or {}).get("completion_tokens")
        return u if isinstance(u, int) and u > 0 else len(self.token_times)

    @property
    def tokens_from(self):
        u = (self.usage or {}).get("completion_tokens")
        return "usage" if isinstance(u, int) and u > 0 else "count"

    @property
    def ended(self):
        return self.done or self.finish_reason is not None

    @property
    def ttft(self):
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def e2el(self):
        return None if self.t_last is None else self.t_last - self.t_start

    @property
    def tpot(self):
        n = self.output_tokens
        if self.t_first is None or n < 2:
            return None
        return (self.t_last - self.t_first) / (n - 1)

    @property
    def itls(self):
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


def absorb(s, choice):
    """Add one choice delta to the Stream; True when it carried a token."""
    if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
        s.finish_reason = choice["finish_reason"]
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        delta = {}
    got = False
    text = choice.get("text")  # /v1/completions
    if isinstance(text, str) and text:
        s.text += text
        got = True
    content = delta.get("content")
    if isinstance(content, str) and content:
        s.text += content
        got = True
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        s.reasoning += reasoning
        got = True
    calls = delta.get("tool_calls")
    for tc in calls if isinstance(calls, list) else []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            continue
        i = tc.get("index", 0)
        slot = s.tool_calls.setdefault(i if isinstance(i, int) else 0, {"name": "", "arguments": ""})
        name, args = fn.get("name"), fn.get("arguments")
        if isinstance(name, str) and name and name != slot["name"]:  # some servers repeat the name in every delta
            slot["name"] += name
        if isinstance(args, str):
            slot["arguments"] += args
        got = True
    return got


def iter_sse(resp):
    """Yield (arrival perf_counter, data) per SSE event, reading whatever bytes have arrived.

    Uses read1 so chunked and close-delimited bodies alike are seen as soon as bytes land."""
    raw = resp.raw
    buf = b""
    data_lines = []
    t_data = None
    while True:
        chunk = raw.read1(65536)
        now = time.perf_counter()
        if not chunk:
            break
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl].rstrip(b"\r"), buf[nl + 1:]
            if not line:
                if data_lines:
                    yield t_data, "\n".join(data_lines)
                    data_lines = []
                continue
            if line.startswith(b"data:"):
                value = line[5:].decode("utf-8", "replace")
                value = value[1:] if value.startswith(" ") else value
                if data_lines and _complete_json(data_lines):  # no blank line between events
                    yield t_data, "\n".join(data_lines)
                    data_lines = []
                data_lines.append(value)
                t_data = now
    if buf.strip().startswith(b"data:"):
        value = buf.strip()[5:].decode("utf-8", "replace").strip()
        data_lines.append(value)
    if data_lines:
        yield t_data or time.perf_counter(), "\n".join(data_lines)


def _complete_json(lines):
    text = "\n".join(lines)
    if text == "[DONE]":
        return True
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
