"""A real HTTP server on 127.0.0.1 that answers what a test sets, well-formed HTTP with unexpected
bodies: `models` and `chat` are any JSON, `stream` the bytes of a streamed answer (with cut, the connection
then drops before the promised length), `trickle` the seconds between the bytes of a chat answer
that goes on for 20 s (then its connection closes short of its length: a client the trickle holds fails
its test rather than hangs); with stream_error, a streamed request is answered HTTP 500 at once and its
body trickles so (other requests get `chat`)."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OddServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, models, chat=None, stream=None, cut=False, trickle=None, stream_error=False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.models, self.chat, self.stream, self.cut, self.trickle = models, chat, stream, cut, trickle
        self.stream_error = stream_error
        self.stopped = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, data, length=None):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def do_GET(self):
        self._send(json.dumps(self.server.models).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        error = self.server.stream_error and body.get("stream")
        if self.server.trickle and (error or not self.server.stream_error):
            self.send_response(500 if error else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            ends = time.monotonic() + 20   # then the connection closes: a client that waits for it fails, not hangs
            while not self.server.stopped.wait(self.server.trickle) and time.monotonic() < ends:
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
        elif body.get("stream") and self.server.stream is not None:
            self._send(self.server.stream, length=len(self.server.stream) + (1000 if self.server.cut else 0))
            time.sleep(0.1)
            self.close_connection = True
        else:
            self._send(json.dumps(self.server.chat).encode())
