"""The memory guard's log: a line '<ISO-8601 ms> message' for each event, to its log file
($STATE_DIR/memguard.log unless --log; past 10 MiB it becomes memguard.log.1) and to stdout, which is
the journal under systemd.
"""
import datetime
import os


def now_iso():
    return datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")


class Log:
    """Lines '<ISO-8601 ms> message' to the log file and stdout (the journal); a slow or broken
    reader never blocks the guard."""

    MAX = 10 << 20

    def __init__(self, path):
        self.path = path
        self.file = open(path, "a", encoding="utf-8")
        try:
            if not os.isatty(1):  # a terminal's flags are shared with the shell: leave them
                os.set_blocking(1, False)
        except OSError:
            pass

    def __call__(self, msg):
        line = f"{now_iso()} {msg}\n"
        try:
            os.write(1, line.encode())
        except OSError:
            pass
        try:
            self.file.write(line)
            self.file.flush()
            if self.file.tell() > self.MAX:
                self.file.close()
                os.replace(self.path, self.path + ".1")
                self.file = open(self.path, "a", encoding="utf-8")
        except (OSError, ValueError):
            pass
