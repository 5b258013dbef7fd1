"""OpenAI-compatible client bits shared by smoke and bench: base URL, key, requests, deadlines
(client/stream.py reads a streamed answer)."""
import json
import os
import re
import threading
import time
from urllib.parse import urlsplit

import requests
import urllib3

from dsv41 import names
from dsv41.client.stream import Stream, absorb, iter_sse
from dsv41.errors import UserError, one_line

DEFAULT_KEY_FILE = names.state_path(names.DEFAULT_STATE_DIR, names.KEY)
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 1800  # each call's deadline: a 262k-token prefill on a busy server can take minutes
HEALTH_TIMEOUT = 5


SERVER_FAULT = 3     # smoke's and bench's exit code when the server cannot be used (2: bad input)


class ServerFault(UserError):
    """The server cannot be used: not reachable, not an OpenAI-compatible answer, no answer in time."""

    exit_code = SERVER_FAULT


class ApiError(ServerFault):
    """The server answered with an error status (or an error event in a stream); a rejected key is
    bad input (exit 2): the key is the user's to fix."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
        self.exit_code = 2 if status in (401, 403) else SERVER_FAULT


class TimedOut(ServerFault):
    """The server sent nothing for the read timeout (or a request's deadline)."""


class RunDeadline(TimedOut):
    """The whole run's deadline (--deadline-s) passed."""


def normalize_base(url):
    """'host:8000', 'http://h:8000/', 'http://h:8000/v1/' -> 'http://h:8000/v1'."""
    url = (url or "").strip()
    if not url:
        raise UserError("no API URL given: pass the base URL, e.g. http://127.0.0.1:8000/v1")
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        parts.port                       # a port out of range, or not a number: ValueError
    except ValueError as err:
        raise UserError(f"bad API URL {url!r} ({one_line(err, 80)}): expected http://HOST:PORT or "
                        "http://HOST:PORT/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not url.isascii() or not url.isprintable():
        raise UserError(f"bad API URL {url!r}: expected http://HOST:PORT or http://HOST:PORT/v1")
    url = url.rstrip("/")
    for suffix in ("/chat/completions", "/completions", "/models"):
        if url.endswith("/v1" + suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


KEY_RE = re.compile(r"[!-~]+")       # printable ASCII, no space: what an HTTP header can carry


def checked_key(key, where):
    """The key, or a UserError naming where it came from when it cannot go in a request's header."""
    if key and not KEY_RE.fullmatch(key):
        raise UserError(f"the API key in {where} holds a space, a line break or a character that is not ASCII: a "
                        f"key is one word of printable ASCII; fix {where}")
    return key


def read_key_file(path):
    """The key in a key file, or None when the file is missing or empty (the one reader of key files)."""
    try:
        with open(os.path.expanduser(path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UserError(f"cannot read API key file {path}: {err.strerror or err}") from None
    try:
        return checked_key(data.decode().strip(), f"API key file {path}") or None
    except UnicodeDecodeError:
        raise UserError(f"API key file {path} is not UTF-8 text: a key is one word of printable ASCII; fix "
                        "the file") from None


def load_key(key_file=None, env=None):
    """DSV41_API_KEY, else the key file (default DEFAULT_KEY_FILE); None when neither exists.

    An explicitly named key file that is missing or empty is an error."""
    env = os.environ if env is None else env
    key = (env.get("DSV41_API_KEY") or "").strip()
    if key:
        return checked_key(key, "DSV41_API_KEY")
    key = read_key_file(key_file or DEFAULT_KEY_FILE)
    if not key and key_file:
        what = "is empty" if os.path.exists(os.path.expanduser(key_file)) else "not found"
        raise UserError(f"API key file {key_file} {what}: set DSV41_API_KEY or pass --key-file (on the head, "
                        "`doit launch` creates the key)")
    return key


def check_request_timeout(seconds, deadline_s=None):
    """--request-timeout-s and --deadline-s of smoke and bench: positive numbers of seconds."""
    for flag, value in (("--request-timeout-s", seconds), ("--deadline-s", deadline_s)):
        if value is not None and not 0 < value < float("inf"):
            raise UserError(f"{flag} {value:g}: give a positive number of seconds, e.g. 600")


def bounded(call, seconds, what):
    """call() within `seconds` of wall time, whatever the server does (silent after accepting, or
    trickling a byte at a time, which resets every per-read timeout); TimedOut after that. The call runs
    in a daemon thread; one still running at the deadline is abandoned and its response closed when it
    comes."""
    box, done = {}, threading.Event()
    lock = threading.Lock()

    def run():
        try:
            result = call()
        except BaseException as err:  # noqa: BLE001  handed to the caller
            box["err"] = err
        else:
            with lock:
                if box.get("abandoned"):
                    getattr(result, "close", lambda: None)()
                box["ok"] = result
        done.set()

    threading.Thread(target=run, daemon=True, name=f"dsv41 {what}").start()
    if not done.wait(seconds):
        with lock:
            box["abandoned"] = True
            late = box.get("ok")
        if late is None:
            raise TimedOut(f"{what} timed out: no complete answer within {seconds:g} s")
    if "err" in box:
        raise box["err"]
    return box["ok"]


class Client:
    """Small OpenAI-compatible client. Each call opens its own connection, so threads may share it.
    Every call ends within read_timeout seconds of wall time (connect and every read together)."""

    def __init__(self, url, key=None, read_timeout=READ_TIMEOUT, deadline_s=None):
        self.base = normalize_base(url)
        self.key = key
        self.read_timeout = read_timeout
        self.deadline_s = deadline_s            # the whole run's, over every call; None: each call's only
        self.ends_at = None if deadline_s is None else time.monotonic() + deadline_s

    def budget(self, seconds):
        """`seconds`, or less so that the call ends by the run's deadline; RunDeadline once it passed."""
        if self.ends_at is None:
            return seconds
        left = self.ends_at - time.monotonic()
        if left <= 0:
            raise RunDeadline(f"the run's deadline of {self.deadline_s:g} s passed (--deadline-s)")
        return min(seconds, left)

    @property
    def past_deadline(self):
        return self.ends_at is not None and time.monotonic() >= self.ends_at - 0.05

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def _request(self, method, path, body=None, stream=False, read_timeout=None, root=False):
        """One request, ended within read_timeout (default the client's) of wall time: with stream=True
        up to the response's headers (Client.stream bounds the body), else the whole body. root: the
        path is under the server's root, not /v1."""
        url = (self.base[: -len("/v1")] if root else self.base) + path
        limit = self.budget(read_timeout or self.read_timeout)
        at = time.perf_counter() + limit
        try:
            resp = bounded(lambda: requests.request(method, url, headers=self.headers(), json=body, stream=stream,
                                                    timeout=(min(CONNECT_TIMEOUT, limit), limit)),
                           limit, f"{method} {url}")
        except requests.exceptions.ConnectionError as err:
            why = "connection refused" if "refused" in str(err).lower() else one_line(err, 120)
            raise ServerFault(f"cannot reach {self.base} ({why}): is the server running and the URL right?") from None
        except requests.exceptions.Timeout:
            raise TimedOut(f"{method} {url} timed out: the server did not answer") from None
        if resp.status_code in (401, 403):
            resp.close()
            hint = "set DSV41_API_KEY or --key-file" if not self.key else "check DSV41_API_KEY or the key file"
            raise ApiError(f"the server at {self.base} rejected the API key (HTTP {resp.status_code}): {hint}",
                           resp.status_code)
        if resp.status_code >= 400:
            detail = one_line(_error_body(resp, stream, at), 200) or "no body"
            raise ApiError(f"{method} {path} failed with HTTP {resp.status_code}: {detail}", resp.status_code)
        return resp

    def get_json(self, path):
        return _object(self._request("GET", path), f"GET {self.base}{path}")

    def post_json(self, path, body, optional=(), root=False):
        """POST; on HTTP 422 (unknown field) retry once without the `optional` fields."""
        return _object(self._with_retry(path, body, optional, stream=False, root=root), f"POST {self.base}{path}")

    def models(self):
        return [m["id"] for m in self.model_entries()]

    def model_entries(self):
        """The /v1/models entries that have an id (vLLM's also carry max_model_len)."""
        data = self.get_json("/models").get("data")
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]] if isinstance(
            data, list) else []

    def served_model(self, model=None):
        """The /v1/models entry of `model` (default: the first listed). A model the server does not
        list is a UserError naming the ones it does."""
        entries = self.model_entries()
        if not entries:
            raise ServerFault(f"{self.base}/models lists no model: is the server still loading it, and is it "
                              "an OpenAI-compatible API?")
        if model is None:
            return entries[0]
        for m in entries:
            if m["id"] == model:
                return m
        names = ", ".join(repr(m["id"]) for m in entries)
        raise UserError(f"model {model!r} is not served at {self.base} (it serves {names}): "
                        "pass one of those as --model")

    @property
    def health_timeout(self):
        """Seconds /health may take: HEALTH_TIMEOUT, or the read timeout when that is shorter."""
        return min(HEALTH_TIMEOUT, self.read_timeout)

    def health(self):
        """HTTP status of the server's /health (beside /v1), or None when it does not answer."""
        try:
            return self._request("GET", "/health", read_timeout=self.health_timeout,
                                 root=True).status_code
        except ApiError as err:
            return err.status
        except UserError:
            return None

    def generates(self, model):
        """Ready to serve: /v1/models answers and a one-token completion comes back. Never raises."""
        try:
            if model not in self.models():
                return False
            r = self.post_json("/completions", {"model": model, "prompt": "Hello", "max_tokens": 1})
            return bool(r.get("choices"))
        except (UserError, requests.RequestException, ValueError):
            return False

    def _with_retry(self, path, body, optional, stream, read_timeout=None, root=False):
        try:
            return self._request("POST", path, body, stream=stream, read_timeout=read_timeout, root=root)
        except ApiError as err:
            if err.status != 422 or not any(k in body for k in optional):
                raise
            return self._request("POST", path, {k: v for k, v in body.items() if k not in optional},
                                 stream=stream, read_timeout=read_timeout, root=root)

    def stream(self, path, body, optional=("stream_options",), stop_after_first=False, deadline_s=None):
        """POST a streaming request and read it to its end (or to the first token); returns a Stream.

        The request is cut deadline_s (default the client's read_timeout) seconds after the POST,
        whether the server is silent or still sending; the Stream keeps what came and has
        finish_reason "timeout"."""
        body = dict(body, stream=True)
        body.setdefault("stream_options", {"include_usage": True})
        s = Stream(t_start=time.perf_counter())
        deadline_s = self.budget(min(self.read_timeout, deadline_s or self.read_timeout))
        at = s.t_start + deadline_s
        try:
            resp = self._with_retry(path, body, optional, stream=True, read_timeout=deadline_s)
        except TimedOut:
            s.timed_out, s.finish_reason = True, "timeout"
            return s
        cutter = _cut_at(resp, at)
        try:
            for t, data in iter_sse(resp):
                if at is not None and t >= at:
                    break
                if data == "[DONE]":
                    s.done = True
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise ServerFault(f"bad SSE message from {path}: {one_line(data, 120)}") from None
                if not isinstance(obj, dict):
                    continue
                if obj.get("error"):
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise ApiError(f"{path} stream reported an error: {one_line(msg, 200)}")
                s.messages += 1
                if isinstance(obj.get("usage"), dict):
                    s.usage = obj["usage"]
                choices = obj.get("choices")
                if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
                    continue
                s.t_last = t
                if absorb(s, choices[0]):
                    s.token_times.append(t)
                    if s.t_first is None:
                        s.t_first = t
                        if stop_after_first:
                            break
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as err:
            if time.perf_counter() < at:
                raise ServerFault(f"the stream from {self.base}{path} broke: {one_line(err, 150)}") from None
        finally:
            cutter.cancel()
            resp.close()
        first_was_enough = stop_after_first and s.t_first is not None
        if not s.ended and not first_was_enough and time.perf_counter() >= at:
            s.timed_out, s.finish_reason = True, "timeout"
        return s


def _object(resp, what):
    """The JSON object a response carries; ServerFault for anything else (a JSON array, a number, HTML)."""
    try:
        obj = resp.json()
    except ValueError:
        raise ServerFault(f"{what} did not return JSON: is this an OpenAI-compatible API?") from None
    if not isinstance(obj, dict):
        raise ServerFault(f"{what} answered a JSON {type(obj).__name__}, not an object: is this an "
                          "OpenAI-compatible API?")
    return obj


def _error_body(resp, stream, at):
    """The start of an error answer's body, read by perf_counter `at` (a streamed request's body is not
    read yet: a server that trickles it is cut there); the response closed."""
    if not stream:
        resp.close()
        return resp.text
    cutter = _cut_at(resp, at)
    try:
        data = resp.raw.read(ERROR_BODY_BYTES)
    except Exception:  # noqa: BLE001  cut, or broken: the status line says enough
        data = b""
    finally:
        cutter.cancel()
        resp.close()
    return data.decode(errors="replace")


ERROR_BODY_BYTES = 2048


def _cut_at(resp, at):
    """A timer that shuts the response's socket for reading at perf_counter `at`, which ends a read
    blocked in another thread."""
    def cut():
        try:
            resp.raw.shutdown()
        except Exception:  # noqa: BLE001  already closed or released: nothing left to cut
            pass
    timer = threading.Timer(max(0.0, at - time.perf_counter()), cut)
    timer.daemon = True
    timer.start()
    return timer
