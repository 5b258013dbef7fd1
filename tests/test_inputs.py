"""Hostile inputs of the client tools and the commands: each refused in one line with its documented exit
code (docs/operating.md: 2 bad input, 3 a server the client tools cannot use), never a traceback. The
tools and the verbs are called in-process; doit itself only where its exit code is what is tested."""
import os
import subprocess
import sys

import pytest

from dsv41.client import api, smoke
from dsv41.client.bench import run_bench
from dsv41.errors import BadInput, UserError
from dsv41.head import incident_log, releases
from dsv41.settings.layers import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD_URLS = ["127.0.0.1:99999", "http://[::1", "http://127.0.0.1:-1/v1", "http://h\u00e9:8000", "http://h:8000\n/v1"]
BAD_KEYS = ["a\nb", "k\u00e9y", "\u9375", "two words", "tab\tkey"]


def smoke_code(argv):
    """python -m dsv41.client.smoke's exit code (its main() returns it, or exits with it)."""
    try:
        return smoke.main(argv)
    except SystemExit as ex:
        return ex.code


def said(capsys):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dsv41: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_url_is_bad_input_for_both_tools(url, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DSV41_API_KEY", "k")
    assert smoke_code([url, "--deadline-s", "2"]) == 2 and "bad API URL" in said(capsys)
    assert run_bench(["--url", url, "--out", str(tmp_path / "b.json")]) == 2 and "bad API URL" in said(capsys)


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_key_that_cannot_go_in_a_header_is_bad_input(key, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DSV41_API_KEY", key)
    assert smoke_code(["127.0.0.1:1"]) == 2 and "the API key in DSV41_API_KEY holds" in said(capsys)
    monkeypatch.delenv("DSV41_API_KEY")
    (tmp_path / "key").write_text(key + "\n")
    assert run_bench(["--url", "127.0.0.1:1", "--out", str(tmp_path / "b.json"), "--key-file", str(tmp_path / "key")]) == 2
    assert f"the API key in API key file {tmp_path / 'key'} holds" in said(capsys)


def test_a_key_file_that_is_not_utf8_or_a_folder_is_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("DSV41_API_KEY", raising=False)
    (tmp_path / "key").write_bytes(b"a\xffb\n")
    (tmp_path / "dir").mkdir()
    for path, why in ((tmp_path / "key", "is not UTF-8 text"), (tmp_path / "dir", "cannot read API key file")):
        assert smoke_code(["127.0.0.1:1", "--key-file", str(path)]) == 2 and why in said(capsys)
    assert api.load_key(None, env={"DSV41_API_KEY": " k-1_x.Y~ "}) == "k-1_x.Y~"      # a key of any printable ASCII


def test_a_server_that_is_not_there_is_a_server_fault(capsys, monkeypatch):
    monkeypatch.setenv("DSV41_API_KEY", "k")
    assert smoke_code(["127.0.0.1:1"]) == 3 and "cannot reach http://127.0.0.1:1/v1 (connection refused)" in said(capsys)


@pytest.mark.parametrize("words", [["bogus"], ["show", "\u00b2"], ["show", "1", "2"], ["show", "-1"]])
def test_a_word_releases_or_rollback_cannot_take_is_bad_input(words, tmp_path, monkeypatch):
    monkeypatch.setenv("STATE_DIR", str(tmp_path))
    cfg = load_config()
    with pytest.raises(BadInput, match="expected `doit releases` or `doit releases show"):
        releases.releases(cfg, words)
    with pytest.raises(BadInput, match="expected `doit rollback` or `doit rollback N`"):
        releases.rollback(cfg, words[1:] or words)


def test_a_superscript_number_is_bad_input_for_incidents_show(tmp_path, monkeypatch):
    """"²" is neither a number `doit incidents` lists (int() refuses it) nor an incident's name: bad input (2)."""
    monkeypatch.setenv("STATE_DIR", str(tmp_path))
    cfg = load_config()
    with pytest.raises(BadInput, match="`doit incidents show \u00b2`: expected a number"):
        incident_log.incidents(cfg, ["show", "\u00b2"])
    with pytest.raises(UserError, match="no incident 7: 0 saved") as err:
        incident_log.incidents(cfg, ["show", "7"])
    assert not isinstance(err.value, BadInput)                   # no such incident: 1
    with pytest.raises(BadInput, match="expected `doit incidents` or `doit incidents show"):
        incident_log.incidents(cfg, ["bogus"])


def doit(args, tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE", "DSV41_API_KEY")}
    e.update({"STATE_DIR": str(tmp_path / "state"), "PORT": "18999", "MPORT": "18998", **env})
    r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), *args],
                       capture_output=True, text=True, env=e, cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in r.stderr, r.stderr
    return r, [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41:")]


def test_doit_exit_codes_of_bad_input(tmp_path):
    (tmp_path / "state").mkdir()
    r, lines = doit(["bench", "--", "--out", str(tmp_path / "b.json"), "--bogus"], tmp_path)
    assert r.returncode == 2 and "error: unrecognized arguments: --bogus" in r.stderr
    r, lines = doit(["smoke", "--deadline-s", "-1"], tmp_path)
    assert r.returncode == 2 and lines == ["dsv41: smoke: --deadline-s -1: give a positive number of seconds, e.g. 600"]
    r, lines = doit(["releases", "show", "\u00b2"], tmp_path)
    assert r.returncode == 2 and len(lines) == 1 and "expected `doit releases`" in lines[0]


def test_a_key_file_that_cannot_be_sent_is_one_line_and_status_answers_what_it_sees(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "api_key").write_bytes(b"a\nb\xff\n")
    r, lines = doit(["smoke", "--deadline-s", "5"], tmp_path)
    assert r.returncode == 2 and len(lines) == 1 and "api_key is not UTF-8 text" in lines[0]
    (tmp_path / "state" / "api_key").write_text("a\nb\n")
    r, lines = doit(["status"], tmp_path)
    assert r.returncode == 3 and "NOT RUNNING" in r.stdout and len(lines) == 1 and "holds a space, a line break" in lines[0]
    (tmp_path / "state" / "engine_key").write_text("a\nb\n")     # rank 0's key, which top asks the engine with
    r, lines = doit(["top", "--once"], tmp_path)
    assert r.returncode == 0 and "cluster: NOT RUNNING" in r.stdout and len(lines) == 1, r.stderr
    assert "engine_key holds a space, a line break" in lines[0]


def test_plan_names_the_ssh_failure_of_a_worker_it_cannot_ask(tmp_path):
    """The head here (its fabric given), worker1 on a port nothing listens on."""
    (tmp_path / "state").mkdir()
    r, lines = doit(["plan"], tmp_path, WORKER="127.0.0.1", SSH_OPTS="-p 1", HEAD_IP="10.0.0.1", HEAD_IFNAME="eth0",
                    HEAD_HCAS="mlx5_0", HEAD_GID_INDEX="3")
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("dsv41: plan: worker1: no fabric facts (cannot reach worker1 (127.0.0.1): ssh: ")
    assert "Connection refused" in lines[0] and "no facts gathered" not in lines[0]
