"""User-facing errors: one line naming the problem and the fix, never a traceback."""
import functools
import sys


class UserError(Exception):
    """A problem the user can fix. str(err) is the whole message, one line."""

    exit_code = 2


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

    return wrapper
