"""A stand-in for the Hugging Face Hub (tests cannot reach the real one): serves a local directory as a
model repo on 127.0.0.1 over the endpoints huggingface_hub 2.4.0 uses for a download, the way the Hub
answers them, plus the LFS "CDN" on 127.0.0.2 that the Hub's resolve endpoint redirects to:

  GET  /api/models/<repo>[/revision/<rev>]         repo info with the commit sha
  GET  /api/models/<repo>/tree/<rev>?recursive=..   file list (size, git oid, lfs sha256)
  HEAD /<repo>/resolve/<rev>/<path>                 X-Repo-Commit, ETag; LFS: 302 + X-Linked-Etag/-Size
  GET  /<repo>/resolve/<rev>/<path>                 small files (Range honoured)
  GET  http://127.0.0.2:<port>/cdn/<sha256>         LFS content (Range honoured, no token)
"""
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_RE = re.compile(r"(\.safetensors|\.part\d{2,})$")


class HubStub:
    def __init__(self, root, repo="0xSero/DeepSeek-V4.1-Flash-Spark", token=None):
        self.root, self.repo, self.token = str(root), repo, token
        self.commit = hashlib.sha1(os.urandom(8)).hexdigest()
        self.log = []                 # dicts: method, path, range_start, sent, auth, host
        self.throttle = {}            # repo path -> bytes per second
        self.cut = {}                 # repo path -> bytes after which its next transfer breaks off (once)
        self.lock = threading.Lock()
        self.rescan()

    def rescan(self):
        self.files = {}
        for r, _, names in os.walk(self.root):
            for n in names:
                p = os.path.join(r, n)
                rel = os.path.relpath(p, self.root)
                data = open(p, "rb").read()
                self.files[rel] = {
                    "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                    "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                    "lfs": bool(LFS_RE.search(rel))}
        self.by_sha = {f["sha256"]: rel for rel, f in self.files.items()}

    def __enter__(self):
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self.cdn = ThreadingHTTPServer(("127.0.0.2", 0), _handler(self, cdn=True))
        for s in (self.hub, self.cdn):
            s.daemon_threads = True
            s.handle_error = lambda *a: None      # clients killed mid-transfer are part of the tests
            threading.Thread(target=s.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.2:{self.cdn.server_address[1]}"
        return self

    def __exit__(self, *exc):
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()

    def content_gets(self):
        """Repo paths whose content was requested (GET on resolve or the CDN)."""
        return [e["path"] for e in self.log if e["method"] == "GET" and e.get("content")]

    def sent(self, path):
        return sum(e.get("sent", 0) for e in self.log if e["path"] == path and e.get("content"))


def _handler(stub, cdn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _reply(self, code, body=b"", headers=None, head=False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, obj, headers=None):
            self._reply(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, code, error_code, head=False):
            self._reply(code, json.dumps({"error": error_code}).encode(),
                        {"X-Error-Code": error_code, "Content-Type": "application/json"}, head)

        def do_HEAD(self):
            self._route(head=True)

        def do_GET(self):
            self._route(head=False)

        def _route(self, head):
            url = urlsplit(self.path)
            path = unquote(url.path)
            entry = {"method": self.command, "path": path, "auth": self.headers.get("authorization"),
                     "host": "cdn" if cdn else "hub", "range": self.headers.get("Range")}
            with stub.lock:
                stub.log.append(entry)
            if cdn:
                m = re.match(r"^/cdn/([0-9a-f]{64})$", path)
                rel = m and stub.by_sha.get(m.group(1))
                if not rel:
                    return self._reply(404, b"no such object", head=head)
                entry["path"] = rel
                return self._send_file(rel, entry, head, {"ETag": f'"{m.group(1)}"'})
            if stub.token and self.headers.get("authorization") != f"Bearer {stub.token}":
                return self._error(401, "RepoNotFound", head)
            repo = re.escape(stub.repo)
            m = re.match(rf"^/api/models/{repo}(?:/revision/([^/]+))?$", path)
            if m:
                if (m.group(1) or "main") not in ("main", stub.commit):
                    return self._error(404, "RevisionNotFound")
                return self._json({"id": stub.repo, "sha": stub.commit, "private": bool(stub.token),
                                   "siblings": [{"rfilename": p} for p in sorted(stub.files)]})
            m = re.match(rf"^/api/models/{repo}/tree/([^/]+)(/.*)?$", path)
            if m:
                if m.group(1) not in ("main", stub.commit):
                    return self._error(404, "RevisionNotFound")
                recursive = parse_qs(url.query).get("recursive", ["False"])[0].lower() == "true"
                return self._json(self._tree(recursive))
            m = re.match(rf"^/{repo}/resolve/([^/]+)/(.+)$", path)
            if m:
                if m.group(1) not in ("main", stub.commit):
                    return self._error(404, "RevisionNotFound", head)
                rel = m.group(2)
                f = stub.files.get(rel)
                if not f:
                    return self._error(404, "EntryNotFound", head)
                entry["path"] = rel
                common = {"X-Repo-Commit": stub.commit, "Accept-Ranges": "bytes"}
                if f["lfs"]:
                    loc = f"{stub.cdn_url}/cdn/{f['sha256']}?sig={quote(rel)}"
                    return self._reply(302, b"", {**common, "Location": loc, "ETag": f'"{f["oid"]}"',
                                                  "X-Linked-Etag": f'"{f["sha256"]}"',
                                                  "X-Linked-Size": str(f["size"])}, head)
                return self._send_file(rel, entry, head, {**common, "ETag": f'"{f["oid"]}"'})
            if re.match(r"^/api/models/", path):
                return self._error(404, "RepoNotFound")
            return self._reply(404, b"not found", head=head)

        def _tree(self, recursive):
            dirs, out = set(), []
            for rel, f in sorted(stub.files.items()):
                parts = rel.split("/")
                if not recursive and len(parts) > 1:
                    dirs.add(parts[0])
                    continue
                for i in range(1, len(parts)):
                    dirs.add("/".join(parts[:i]))
                e = {"type": "file", "oid": f["oid"], "size": f["size"], "path": rel}
                if f["lfs"]:
                    e["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
                out.append(e)
            return [{"type": "directory", "oid": "0" * 40, "path": d} for d in sorted(dirs)] + out

        def _send_file(self, rel, entry, head, headers):
            size = stub.files[rel]["size"]
            start = 0
            m = re.match(r"^bytes=(\d+)-$", self.headers.get("Range") or "")
            code = 200
            if m:
                start, code = int(m.group(1)), 206
                if start >= size:
                    return self._reply(416, b"", {"Content-Range": f"bytes */{size}"}, head)
                headers = {**headers, "Content-Range": f"bytes {start}-{size - 1}/{size}"}
            self.send_response(code)
            for k, v in {**headers, "Accept-Ranges": "bytes", "Content-Length": str(size - start)}.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return
            entry.update(content=True, sent=0, range_start=start)
            rate = stub.throttle.get(rel)
            with stub.lock:
                cut = stub.cut.pop(rel, None)
            with open(os.path.join(stub.root, rel), "rb") as f:
                f.seek(start)
                while True:
                    if cut is not None and entry["sent"] >= cut:
                        self.close_connection = True      # a dropped connection: less than Content-Length
                        return
                    want = 16384 if rate else 1 << 20
                    chunk = f.read(want if cut is None else min(want, cut - entry["sent"]))
                    if not chunk:
                        break
                    try:
                        self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        self.close_connection = True
                        return
                    entry["sent"] += len(chunk)
                    if rate:
                        time.sleep(len(chunk) / rate)

    return Handler
