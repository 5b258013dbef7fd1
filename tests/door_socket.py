"""HAProxy on the gateway's rendered config as systemd runs it, for the tests that start a real one: the test
holds the port (as dsv41-gateway.socket holds PORT) and every HAProxy it starts gets it as descriptor 3
(`bind fd@3`, names.GATEWAY_LISTEN_FD), so the port outlives any one HAProxy."""
import socket
import subprocess
import sys

from dsv41 import names

# the descriptor moved to its place, then haproxy in this process's place (its pid is HAProxy's)
MOVE = "import os, sys; fd, want = map(int, sys.argv[1:3]); os.dup2(fd, want); fd != want and os.close(fd); " \
       "os.execvp(sys.argv[3], sys.argv[3:])"


def hold(port=0, host="127.0.0.1"):
    """A listening socket on host:port (0: a free port; .getsockname()[1] says which), as the socket unit holds
    PORT. The caller closes it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(4096)
    return s


def haproxy(args, held, **popen):
    """subprocess.Popen of `haproxy ARGS` with `held` (hold()) as its descriptor 3, and no other copy of it."""
    fd = held.fileno()
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", MOVE, str(fd), str(names.GATEWAY_LISTEN_FD), "haproxy",
                             *args], pass_fds=(fd,), **popen)
