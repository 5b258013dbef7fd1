"""User-facing errors: one line naming the problem and the fix, never a traceback."""
import functools
import os
import sys

CLOSED_PIPE_EXIT = 141      # 128 + SIGPIPE: what a shell reports for a tool whose reader went away


class UserError(Exception):
    """A problem the user can fix. str(err) is the whole message, one line."""

    exit_code = 2


class BadInput(UserError):
    """A setting, an option or a word the command cannot take: a doit task then exits 2, as for a bad
    setting (any other UserError fails the task: 1)."""


def one_line(text, limit=300):
    """Collapse whitespace so a message (or a stderr tail) fits on one line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cli(func):
    """Decorate a command-line main(): a UserError prints 'dsv41: <message>' and exits non-zero."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as err:
            print(f"dsv41: {one_line(err, 2000)}", file=sys.stderr)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            print("dsv41: interrupted", file=sys.stderr)
            sys.exit(130)
        except BrokenPipeError:
            closed_pipe()

    return wrapper


def closed_pipe():
    """The reader of stdout went away (`| head -1`): stop quietly, as a tool killed by SIGPIPE does.
    stdout is pointed at /dev/null first so the interpreter's last flush cannot complain."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    raise SystemExit(CLOSED_PIPE_EXIT)


class QuietPipe:
    """A stdout that ends the process with closed_pipe() when its reader went away, wherever the
    write happens (a task's action, or doit's own listing and help)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            closed_pipe()

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            closed_pipe()

    def __getattr__(self, name):
        return getattr(self._stream, name)
