"""`doit download` through the real huggingface_hub client against tests/hubstub.py, a local stand-in
for the Hugging Face Hub (127.0.0.1, with its LFS CDN on 127.0.0.2)."""
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv41.node import checkpoint
from fixture_checkpoint import make_checkpoint, shard_name
from hubstub import HubStub
from test_checkpoint import on_pty

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = "0xSero/DeepSeek-V4.1-Flash-Spark"
S5, S6 = shard_name(5), shard_name(6)
DOWNLOAD = ("from dsv41.settings.layers import load_config; from dsv41.head.download import download; "
            "from dsv41.errors import cli; cli(lambda: download(load_config()))()")


@pytest.fixture
def repo(tmp_path):
    facts = make_checkpoint(str(tmp_path / "repo"), shard_bytes=2_000_000, parts=3)
    return tmp_path / "repo", facts


def env_for(hub, tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf home"), HF_HUB_DISABLE_TELEMETRY="1",
               MODEL_DIR=str(tmp_path / "model 'dir'"), STATE_DIR=str(tmp_path / "state"), **extra)
    return env


def download(env, **kw):
    return subprocess.run([sys.executable, "-c", DOWNLOAD], env=env, capture_output=True, text=True, **kw)


def receipt(tmp_path):
    return json.loads((tmp_path / "state" / "checkpoint-receipt.json").read_text())


def test_download_reassembles_verifies_and_second_run_fetches_nothing(repo, tmp_path):
    src, facts = repo
    with HubStub(src) as hub:
        env = env_for(hub, tmp_path)
        r = download(env)
        assert r.returncode == 0, r.stderr
        model = tmp_path / "model 'dir'"
        assert sorted(hub.content_gets()) == sorted(hub.files), "every file fetched exactly once"
        assert {k: v["sha256"] for k, v in receipt(tmp_path)["files"].items()} == facts["shards"]
        assert (model / S5).exists() and not list(model.glob("*.part0*"))
        assert receipt(tmp_path)["exl3_files"] == 9
        # nothing changed: the parts of the verified shards 5 and 6 are not fetched again, nor anything else
        hub.log.clear()
        r = download(env)
        assert r.returncode == 0, r.stderr
        assert hub.content_gets() == []


@pytest.mark.parametrize("how", ["a list", "a wrong type", "not UTF-8", "a folder"])
def test_a_broken_download_record_is_one_line_and_nothing_is_fetched(repo, tmp_path, how):
    src, _ = repo
    with HubStub(src) as hub:
        env = env_for(hub, tmp_path)
        assert download(env).returncode == 0
        records = tmp_path / "model 'dir'" / ".cache" / "dsv41" / "download.json"
        good = json.loads(records.read_text())
        if how == "a list":
            records.write_text(json.dumps(list(good)))
        elif how == "a wrong type":
            records.write_text(json.dumps({p: {**r, "size": "x"} for p, r in good.items()}))
        elif how == "not UTF-8":
            records.write_bytes(b"\xff" + records.read_bytes())
        else:
            records.unlink()
            records.mkdir()
        hub.log.clear()
        r = download(env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"dsv41: {records} ") and "move it aside" in line, line
    assert hub.content_gets() == []


def test_parts_not_refetched_when_shards_are_there_without_receipt(repo, tmp_path):
    src, facts = repo
    with HubStub(src) as hub:
        env = env_for(hub, tmp_path)
        assert download(env).returncode == 0
        (tmp_path / "state" / "checkpoint-receipt.json").unlink()
        hub.log.clear()
        r = download(env)
        assert r.returncode == 0, r.stderr
        assert not [p for p in hub.content_gets() if ".part0" in p]
        assert {k: v["sha256"] for k, v in receipt(tmp_path)["files"].items()} == facts["shards"]


def test_damaged_shard_is_rebuilt_from_fetched_parts(repo, tmp_path):
    src, facts = repo
    with HubStub(src) as hub:
        env = env_for(hub, tmp_path)
        assert download(env).returncode == 0
        shard = tmp_path / "model 'dir'" / S6
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        shard.write_bytes(bytes(data))
        hub.log.clear()
        r = download(env)
        assert r.returncode == 0, r.stderr
        assert sorted(hub.content_gets()) == sorted(f"{S6}.part{k:02d}" for k in range(3))
        assert receipt(tmp_path)["files"][S6]["sha256"] == facts["shards"][S6]


def test_killed_download_resumes_without_refetching(tmp_path):
    # parts larger than huggingface_hub's 10 MB write granularity
    src = tmp_path / "repo"
    facts = make_checkpoint(str(src), shard_bytes=50_000_000, parts=2)
    big = f"{S5}.part00"
    with HubStub(src) as hub:
        hub.throttle[big] = 15_000_000    # bytes/s: slow enough to be killed in the middle
        env = env_for(hub, tmp_path)
        p = subprocess.Popen([sys.executable, "-c", DOWNLOAD], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        size = hub.files[big]["size"]
        deadline = time.monotonic() + 30
        while hub.sent(big) < size // 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        p.kill()
        p.wait()
        first = hub.sent(big)
        assert 0 < first < size
        hub.throttle.clear()
        hub.log.clear()
        r = download(env)
        assert r.returncode == 0, r.stderr
        gets = [e for e in hub.log if e.get("content") and e["path"] == big]
        assert len(gets) == 1 and gets[0]["range_start"] > 0, "the interrupted file resumes with a Range"
        assert gets[0]["sent"] == size - gets[0]["range_start"]
        done_before = {e["path"] for e in hub.log if e.get("content")}
        assert "sha256-manifest.txt" not in done_before, "finished files are not fetched again"
        assert receipt(tmp_path)["files"][S5]["sha256"] == facts["shards"][S5]


def test_dropped_connection_resumes_within_the_same_run(repo, tmp_path):
    src, facts = repo
    part = f"{S6}.part01"
    with HubStub(src) as hub:
        hub.cut[part] = 250_000
        r = download(env_for(hub, tmp_path))
        assert r.returncode == 0, r.stderr
        gets = [e for e in hub.log if e.get("content") and e["path"] == part]
        assert [(g["range_start"], g["sent"]) for g in gets] == [(0, 250_000), (250_000, hub.files[part]["size"] - 250_000)]
        assert receipt(tmp_path)["files"][S6]["sha256"] == facts["shards"][S6]


def test_token_is_sent_to_the_hub_but_not_to_the_cdn(repo, tmp_path):
    src, _ = repo
    with HubStub(src, token="hf_secret") as hub:
        r = download(env_for(hub, tmp_path))
        assert r.returncode != 0
        assert r.stderr.strip().splitlines()[-1].startswith("dsv41: HF_REPO=") and "HF_TOKEN" in r.stderr
        assert "Traceback" not in r.stderr
        hub.log.clear()
        r = download(env_for(hub, tmp_path, HF_TOKEN="hf_secret"))
        assert r.returncode == 0, r.stderr
        assert all(e["auth"] == "Bearer hf_secret" for e in hub.log if e["host"] == "hub")
        assert [e for e in hub.log if e["host"] == "cdn"] and \
            all(e["auth"] is None for e in hub.log if e["host"] == "cdn")


def test_revision_pins_a_commit(repo, tmp_path):
    src, _ = repo
    with HubStub(src) as hub:
        r = download(env_for(hub, tmp_path, REVISION="0" * 40))
        assert r.returncode != 0 and "dsv41: REVISION=" + "0" * 40 + " is not in" in r.stderr
        assert not (tmp_path / "model 'dir'" / S5).exists()
        r = download(env_for(hub, tmp_path, REVISION=hub.commit))
        assert r.returncode == 0, r.stderr
        assert all(hub.commit in e["path"] for e in hub.log if "/resolve/" in e["path"] and e["host"] == "hub"
                   and e["method"] == "HEAD")


def test_hub_unreachable(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "h"),
           "MODEL_DIR": str(tmp_path / "m"), "STATE_DIR": str(tmp_path / "s")}
    r = download(env)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("dsv41: cannot reach the Hub at http://127.0.0.1:9")


def test_not_enough_space_says_how_much_is_missing(repo, tmp_path, monkeypatch):
    src, _ = repo
    from dsv41.head import download
    from dsv41.settings.layers import load_config
    from dsv41.errors import UserError
    with HubStub(src) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setattr(checkpoint, "free_bytes", lambda p: 1_000_000)
        cfg = load_config({"MODEL_DIR": str(tmp_path / "m"), "STATE_DIR": str(tmp_path / "s"),
                           "HF_ENDPOINT": hub.endpoint})
        with pytest.raises(UserError) as e:
            download.download(cfg)
        # 4 whole shards + 6 parts + banks to fetch, plus shards 5 and 6 to rebuild
        assert str(e.value).startswith(f"MODEL_DIR {tmp_path / 'm'} needs 16.0 MB free (12.0 MB to download "
                                       "+ 4.0 MB to reassemble shards) but has 1.0 MB: free 15.0 MB more")
        assert not [p for p in hub.content_gets() if "model-" in p], "nothing big fetched before the check"


def test_hub_partials_left_by_a_killed_run_are_removed(repo, tmp_path):
    """hf_hub_download never resumes from its temp files, so one left by a killed run only takes space."""
    src, _ = repo
    with HubStub(src) as hub:
        env = env_for(hub, tmp_path)
        leftover = tmp_path / "model 'dir'" / ".cache" / "huggingface" / "download" / "exl3" / "qn" / \
            "L00.part.safetensors.0123abcd.5f3a9c1e.incomplete"
        leftover.parent.mkdir(parents=True)
        leftover.write_bytes(b"x" * 100_000)
        r = download(env)
        assert r.returncode == 0, r.stderr
        assert not leftover.exists()


# ---- progress: one bar, in place on a terminal, plain lines otherwise ----------------------------------

def test_download_progress_is_plain_lines_when_stderr_is_not_a_terminal(repo, tmp_path, capfd, monkeypatch):
    from dsv41.head import download as head_download
    from dsv41.head.core import progress
    from dsv41.settings.layers import load_config
    src, _ = repo
    monkeypatch.setattr(progress, "INTERVAL_S", 0)       # a line per update instead of one every 10 s
    with HubStub(src) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        head_download.download(load_config({"MODEL_DIR": str(tmp_path / "m"), "STATE_DIR": str(tmp_path / "s"),
                                            "HF_ENDPOINT": hub.endpoint}))
    err = capfd.readouterr().err
    assert "\r" not in err, err
    lines = err.splitlines()
    assert all(ln.startswith((f"download {REPO}: ", f"download: {REPO}@", f"verify {tmp_path / 'm'}: "))
               for ln in lines), err                       # our bar only: none of huggingface_hub's own
    fetch = [ln for ln in lines if ln.startswith(f"download {REPO}: ")]
    assert fetch[-1].startswith(f"download {REPO}: 12.0MB/12.0MB (100%) in "), err


def test_download_progress_updates_in_place_on_a_terminal(repo, tmp_path):
    src, _ = repo
    with HubStub(src) as hub:
        code, out = on_pty([sys.executable, "-c", DOWNLOAD], env_for(hub, tmp_path), cols=200)
    assert code == 0, out
    assert "\r" in out and out.endswith("\n"), repr(out)
    shown = [seg for seg in out.replace("\r", "\n").split("\n") if seg.strip()]
    assert all(seg.startswith((f"download {REPO}: ", f"download: {REPO}@", "verify ")) for seg in shown), out
    assert [seg for seg in shown if seg.startswith(f"download {REPO}: 100%|") and "12.0MB/12.0MB" in seg], out


# ---- huggingface_hub through its public API only -----------------------------------------------------

HUB = "huggingface_hub"


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_hub_uses(source, filename="<source>"):
    """What a module uses of huggingface_hub that is private: a module path with a `_` part or a `_` name
    imported, a `_` attribute reached from an imported name, a `_` keyword argument to one of its callables."""
    tree = ast.parse(source, filename)
    bound, found = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == HUB or a.name.startswith(HUB + "."):
                    if any(_private(p) for p in a.name.split(".")):
                        found.add(f"import {a.name}")
                    bound.add(a.asname or HUB)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                (node.module == HUB or node.module.startswith(HUB + ".")):
            for a in node.names:
                if any(_private(p) for p in node.module.split(".")) or _private(a.name):
                    found.add(f"from {node.module} import {a.name}")
                bound.add(a.asname or a.name)

    def chain(expr):
        """(root name, attributes) of a.b.c, or (None, [])."""
        attrs = []
        while isinstance(expr, ast.Attribute):
            attrs.insert(0, expr.attr)
            expr = expr.value
        return (expr.id, attrs) if isinstance(expr, ast.Name) else (None, [])

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root, attrs = chain(node)
            if root in bound and any(_private(a) for a in attrs):
                found.add(".".join([root, *attrs]))
        elif isinstance(node, ast.Call):
            root, attrs = chain(node.func)
            if root in bound:
                found.update(f"{'.'.join([root, *attrs])}({kw.arg}=)" for kw in node.keywords
                             if kw.arg and _private(kw.arg))
    return sorted(found)


def test_lib_uses_only_public_huggingface_hub_names():
    lib = Path(ROOT) / "lib"
    found = {str(p.relative_to(lib)): private_hub_uses(p.read_text(), str(p)) for p in sorted(lib.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}


def test_private_huggingface_hub_uses_are_caught():
    source = """
import huggingface_hub as hf
import huggingface_hub._snapshot_download
from huggingface_hub import HfApi, __version__
from huggingface_hub.utils._runtime import is_xet_available
from huggingface_hub.file_download import http_get, _chmod_and_move
from huggingface_hub.utils import build_hf_headers
http_get(url, out, resume_size=0, _tqdm_bar=bar)
hf.file_download._int_or_none("1")
hf.utils.build_hf_headers(token=None)
HfApi(endpoint=None).model_info("a/b")
"""
    assert private_hub_uses(source) == [
        "from huggingface_hub.file_download import _chmod_and_move",
        "from huggingface_hub.utils._runtime import is_xet_available",
        "hf.file_download._int_or_none",
        "http_get(_tqdm_bar=)",
        "import huggingface_hub._snapshot_download"]
