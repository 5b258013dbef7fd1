"""A child process polled, never waited for: what lets doit top keep drawing while a node is frozen.
Its output goes to temp files and it runs in its own session; one that overruns its deadline is killed
with its whole process group."""
import os
import signal
import subprocess
import tempfile
import time


class Job:
    """A child process polled without waiting: its output goes to temp files (a full pipe never
    stalls it) and it runs in its own process group, killed whole when it overruns its deadline."""

    def __init__(self, argv, deadline_s, stdin_data=None, env=None):
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                                     stdout=self.out, stderr=self.err, start_new_session=True, env=env)
        if stdin_data is not None:
            try:
                self.proc.stdin.write(stdin_data)
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.deadline = time.monotonic() + deadline_s

    def poll(self):
        """None while it runs; then (exit code, stdout, stderr), the exit code None when it overran
        its deadline and was killed."""
        code = self.proc.poll()
        if code is None:
            if time.monotonic() < self.deadline:
                return None
            self.kill()
            return None, "", ""
        out, err = (self._read(f) for f in (self.out, self.err))
        self.out.close()
        self.err.close()
        return code, out, err

    @staticmethod
    def _read(f):
        f.seek(0)
        return f.read().decode("utf-8", "replace")

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.out.close()
        self.err.close()
