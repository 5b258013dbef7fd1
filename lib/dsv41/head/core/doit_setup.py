"""How dsv41 uses doit: size+mtime file checks, the run lock for mutating tasks, one-line failures."""
import functools
import os
import sys

from doit.cmd_base import DodoTaskLoader, DoitCmdBase
from doit.cmdparse import CmdParseError
from doit.dependency import FileChangedChecker
from doit.exceptions import InvalidCommand, TaskError, TaskFailed
from doit.reporter import ConsoleReporter

from dsv41 import names
from dsv41.errors import BadInput, QuietPipe, UserError, one_line
from dsv41.head.core import runlock


class SizeMtimeChecker(FileChangedChecker):
    """A file dependency changed when its size or mtime did. Never reads the file: doit's md5
    default would re-hash a whole shard after a mere touch."""

    def check_modified(self, file_path, file_stat, state):
        return state is None or [file_stat.st_size, file_stat.st_mtime_ns] != list(state)

    def get_state(self, dep, current_state):
        st = os.stat(dep)
        new = [st.st_size, st.st_mtime_ns]
        return None if current_state is not None and list(current_state) == new else new


class Reporter(ConsoleReporter):
    """doit's console reporter, but a user error is one line, `dsv41: <task>: <message>`, and
    progress lines (`.  task`, `-- task` when up to date) go to stderr so stdout stays parseable."""

    def write(self, text):
        sys.stderr.write(text)

    def add_failure(self, task, fail):
        if getattr(fail, "dsv41", False):
            self.failures.append({"task": task, "exception": fail})
            sys.stderr.write(f"dsv41: {task.name}: {fail.message}\n")
            return
        super().add_failure(task, fail)

    def complete_run(self):
        self.failures = [f for f in self.failures if not getattr(f["exception"], "dsv41", False)]
        super().complete_run()


def dep_file(state_dir):
    """doit's record of what ran ($STATE_DIR/doit.db), the state dir made first. A STATE_DIR that cannot
    be made is bad input; a doit.db that cannot be opened is said in one line and a record in memory is
    used instead, so the command still answers (a launch then checks every step again)."""
    try:
        os.makedirs(state_dir, exist_ok=True)
    except OSError as err:
        why = "is a file, not a folder" if isinstance(err, FileExistsError) else f"cannot be made ({err.strerror or err})"
        raise BadInput(f"STATE_DIR {state_dir} {why}: set STATE_DIR to a folder this user can write") from None
    db = names.state_path(state_dir, names.DOIT_DB)
    import sqlite3                       # doit's backend imports it anyway
    try:
        conn = sqlite3.connect(db)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        finally:
            conn.close()
        return db
    except sqlite3.Error as err:
        print(f"dsv41: {db} cannot be read ({one_line(err, 100)}): move it aside (to {names.DOIT_DB}.bad); this "
              "run keeps doit's record in memory (a launch checks every step again)", file=sys.stderr, flush=True)
        return ":memory:"


class Loader(DodoTaskLoader):
    """dodo.py's loader, named in pyproject.toml's [tool.doit] so that it is made before doit reads the command
    line: doit takes every NAME=VALUE word as a variable of its own (`doit rollback 2=` would run the default
    rollback) and fails with a traceback on an empty word (`doit keys add ""`). dsv41 uses no doit variable:
    either word is bad input, one line and exit 2, before anything runs."""

    def __init__(self):
        super().__init__()
        _refuse(command_line_problem(sys.argv[1:]))

    def load_tasks(self, cmd, pos_args):
        """The tasks; an option shortened to a prefix of a task's option (`doit stop --free`, which doit's
        parser takes as --free-port) is bad input: one line, exit 2, before the task runs."""
        tasks = super().load_tasks(cmd, pos_args)
        _refuse(option_problem({t.name: t for t in tasks}, pos_args or []))
        return tasks


def _refuse(problem):
    if problem:
        print(f"dsv41: {problem}", file=sys.stderr)
        raise SystemExit(2)


def option_problem(tasks, words):
    """An option among a task's words that only a prefix of one of its options matches, or None."""
    task = None
    for word in words:
        if word == "--":
            task = None
        elif word in tasks:
            task = tasks[word]
        elif task is not None and word.startswith("--"):
            name = word[2:].split("=", 1)[0]
            longs = [p["long"] for p in task.params if p.get("long")]
            if name not in longs and any(long.startswith(name) for long in longs):
                return (f"{task.name}: `--{name}` is not an option: say it whole (`--"
                        f"{next(long for long in longs if long.startswith(name))}`); `doit help {task.name}` lists them")
    return None


def command_line_problem(words):
    """What doit would misread in a command line's words, or None."""
    for word in words:
        if word == "":
            return "an empty word on the command line: give the value (e.g. `doit keys add NAME`)"
        if not word.startswith("-") and "=" in word:
            return (f"{word!r}: doit takes NAME=VALUE words as variables, and dsv41 has none: a setting is an "
                    "environment variable (`NAME=VALUE doit ...`), an option's value follows it (`--opt=VALUE`)")
    return None


def quiet_on_closed_pipe():
    """`doit ... | head -1` ends quietly with 141, as a tool killed by SIGPIPE (errors.closed_pipe),
    never with a BrokenPipeError traceback: stdout becomes a QuietPipe. doit's own commands (list,
    help, info) write to the stdout they kept when doit made them, before it loaded dodo.py, so the
    command that is loading it is given the QuietPipe too."""
    if not isinstance(sys.stdout, QuietPipe):
        sys.stdout = QuietPipe(sys.stdout)
    for cmd in _loading_commands():
        cmd.outstream = sys.stdout


def _loading_commands():
    """The doit commands on the stack: the one loading dodo.py."""
    frame = sys._getframe(1)
    while frame is not None:
        cmd = frame.f_locals.get("self")
        if isinstance(cmd, DoitCmdBase):
            yield cmd
        frame = frame.f_back


def bad_options_exit_2():
    """A task option doit cannot parse (`doit status --bogus`, `doit top --interval x`) or a task it does
    not know is bad input: one line and exit 2. doit itself returns 3 for them, which `doit status`
    means as NOT RUNNING. (doit's own options, before the task name, are parsed before dodo.py loads.)"""
    for cmd in _loading_commands():
        if "_execute" in type(cmd).__dict__:
            cmd._execute = _checked(cmd, cmd._execute)


def _checked(cmd, execute):
    @functools.wraps(execute)
    def run(*args, **kwargs):
        try:
            return execute(*args, **kwargs)
        except (CmdParseError, InvalidCommand) as err:
            msg = one_line(str(err).split(" (parsing options:")[0].removeprefix("Error parsing Task: "), 400)
            task = (getattr(cmd, "sel_tasks", None) or ["TASK"])[0]
            if isinstance(err, InvalidCommand):
                print(f"dsv41: {msg}", file=sys.stderr)
            else:
                print(f"dsv41: {task}: {msg}: `doit help {task}` lists its options", file=sys.stderr)
            raise SystemExit(2) from None
    return run


def action(func, *, name=None, lock_dir=None):
    """Wrap a task function: a UserError fails the task with its one line, not a traceback (doit exits
    1; 2 for BadInput, as for a bad setting). With lock_dir the action first takes the run lock
    (mutating tasks)."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        try:
            if lock_dir:
                runlock.take(lock_dir)
            result = func(*args, **kwargs)
            sys.stdout.flush()          # a closed pipe shows here, inside the guarded stdout
        except UserError as err:
            if getattr(err, "exit_now", False):      # an outcome with its own exit code (a rollback)
                sys.stdout.flush()
                sys.stderr.write(f"dsv41: {run.__name__}: {one_line(err, 2000)}\n")
                raise SystemExit(err.exit_code) from None
            fail = (TaskError if isinstance(err, BadInput) else TaskFailed)(one_line(err, 2000))
            fail.dsv41 = True
            return fail
        except KeyboardInterrupt:
            fail = TaskFailed("interrupted; run the same command again to resume")
            fail.dsv41 = True
            return fail
        if result is False:
            fail = TaskFailed("failed (see the lines above)")
            fail.dsv41 = True
            return fail
        return result if isinstance(result, dict) else None

    if name:
        run.__name__ = name
    return run
