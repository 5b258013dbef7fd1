"""Earlier code for a benchmark's baseline, run from that commit's own tree.

A benchmark pins the commit (40 hex digits, with a comment saying what its code is and why it is the
baseline); checkout() adds a detached git worktree of it in a temporary folder and removes it afterwards,
also on a failure, Ctrl-C or SIGTERM. The earlier code runs in a separate Python process with that tree's
lib/ first on sys.path (env(tree)), so nothing of it depends on where modules live today.

    with baseline.checkout(BASELINE) as tree:
        subprocess.run([sys.executable, "-c", CHILD], env=baseline.env(tree), check=True)
"""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)


def missing(commit, repo=ROOT):
    """Why commit cannot be checked out of repo (one line), or None when it can."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return f"baseline commit {commit!r} is not pinned as 40 hex digits"
    if _git(repo, "rev-parse", "--git-dir").returncode:
        return f"{repo} is not a git checkout: the baseline commit {commit[:12]} needs the repository's history"
    if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        how = ("this clone is shallow: run `git fetch --unshallow`"
               if _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
               else "fetch the repository's full history into it")
        return f"baseline commit {commit[:12]} is not in {repo}: {how}, then run the benchmark again"
    return None


@contextlib.contextmanager
def checkout(commit, repo=ROOT):
    """A detached worktree of commit in a temporary folder (its path), removed when the block ends.
    Raises SystemExit with one line when the commit is not in the repository."""
    why = missing(commit, repo)
    if why:
        raise SystemExit(f"bench: {why}")
    tmp = tempfile.mkdtemp(prefix="dsv41-baseline-")
    tree = os.path.join(tmp, f"baseline-{commit[:12]}")
    with _sigterm_exits():
        try:
            r = _git(repo, "worktree", "add", "--detach", "--quiet", tree, commit)
            if r.returncode:
                raise SystemExit(f"bench: git worktree add {commit[:12]} failed: {' '.join(r.stderr.split())}")
            yield tree
        finally:
            _git(repo, "worktree", "remove", "--force", tree)
            _git(repo, "worktree", "prune")
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_exits():
    """SIGTERM ends the process through its finally blocks, as Ctrl-C does (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def env(tree, base=None):
    """An environment (os.environ, or base) for a Python process that imports dsv41 from tree/lib alone."""
    return {**(os.environ if base is None else base), "PYTHONPATH": os.path.join(tree, "lib")}
