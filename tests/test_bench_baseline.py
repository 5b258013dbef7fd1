"""bench/baseline.py: a benchmark's pinned commit checked out into a temporary worktree, its code run in a
separate process with that tree's lib/ on sys.path, the worktree removed afterwards (also on Ctrl-C and
SIGTERM); a commit the clone does not hold is one line. The repositories are made in tmp_path."""
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import baseline  # noqa: E402

WHERE = "import dsv41.where as w; print(w.WHAT, w.__file__)"


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """(a repository whose lib/dsv41/where.py says 'then' at its first commit and 'now' at its second,
    the first commit)."""
    r = tmp_path / "repo"
    (r / "lib" / "dsv41").mkdir(parents=True)
    git(r, "init", "-q")
    (r / "lib" / "dsv41" / "__init__.py").write_text("")
    for what in ("then", "now"):
        (r / "lib" / "dsv41" / "where.py").write_text(f"WHAT = {what!r}\n")
        git(r, "add", "-A")
        git(r, "commit", "-q", "-m", what)
    return r, git(r, "rev-list", "--max-parents=0", "HEAD")


def worktrees(repo):
    return git(repo, "worktree", "list", "--porcelain").count("worktree ")


def test_the_pinned_commit_runs_from_its_own_tree_which_is_removed_after(repo):
    r, first = repo
    with baseline.checkout(first, repo=str(r)) as tree:
        what, where = subprocess.run([sys.executable, "-c", WHERE], env=baseline.env(tree), check=True,
                                     capture_output=True, text=True).stdout.split()
        assert what == "then" and where.startswith(tree)
        assert worktrees(r) == 2
    assert not Path(tree).exists() and not Path(tree).parent.exists()
    assert worktrees(r) == 1 and (r / "lib" / "dsv41" / "where.py").read_text() == "WHAT = 'now'\n"


def test_the_worktree_is_removed_after_a_failure(repo):
    r, first = repo
    with pytest.raises(KeyboardInterrupt):
        with baseline.checkout(first, repo=str(r)) as tree:
            raise KeyboardInterrupt
    assert not Path(tree).exists() and worktrees(r) == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_worktree_is_removed_when_the_benchmark_is_interrupted(repo, sig):
    r, first = repo
    script = (f"import sys, time; sys.path.insert(0, {str(BENCH)!r}); import baseline\n"
              f"with baseline.checkout({first!r}, repo={str(r)!r}) as tree:\n"
              f"    print(tree, flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    tree = proc.stdout.readline().strip()
    assert Path(tree).is_dir()
    proc.send_signal(sig)
    assert proc.wait(30) != 0
    assert not Path(tree).exists() and worktrees(r) == 1


def test_an_unknown_commit_is_one_line(repo):
    r, _ = repo
    with pytest.raises(SystemExit) as err:
        with baseline.checkout("0123456789abcdef" * 2 + "01234567", repo=str(r)):
            pass
    said = str(err.value.code)
    assert "\n" not in said and said.startswith("bench: baseline commit 0123456789ab is not in"), said
    assert worktrees(r) == 1


def test_a_shallow_clone_says_how_to_get_the_commit(repo, tmp_path):
    r, first = repo
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{r}", str(shallow)], check=True)
    with pytest.raises(SystemExit) as err:
        with baseline.checkout(first, repo=str(shallow)):
            pass
    said = str(err.value.code)
    assert "\n" not in said and "shallow" in said and "git fetch --unshallow" in said, said


def test_a_commit_is_pinned_in_full(repo):
    r, first = repo
    with pytest.raises(SystemExit, match="40 hex digits"):
        with baseline.checkout(first[:12], repo=str(r)):
            pass


def test_every_benchmark_pins_a_commit_of_this_repository():
    pinned = {f.name: re.findall(r'^BASELINE = "([^"]*)"', f.read_text(), re.M) for f in BENCH.glob("bench_*.py")}
    pinned = {name: shas for name, shas in pinned.items() if shas}
    assert {"bench_config.py", "bench_download.py", "bench_memguard.py"} <= set(pinned)
    for name, shas in pinned.items():
        assert len(shas) == 1 and re.fullmatch(r"[0-9a-f]{40}", shas[0]), name
        why = baseline.missing(shas[0])
        if why and ("shallow" in why or "not a git checkout" in why):
            pytest.skip(why)
        assert why is None, f"{name}: {why}"
