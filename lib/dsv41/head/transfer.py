"""Head side of the checkpoint: download from the Hub (huggingface_hub) and copy to workers (rsync over
the Node layer's ssh). Both are resumable: a byte-level resume for HTTP downloads and rsync partials,
and receipts so finished and verified files are never fetched, sent or hashed again."""
import concurrent.futures as cf
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from urllib.parse import urlparse

from dsv41 import checkpoint as ck
from dsv41.errors import UserError, one_line
from dsv41.nodes import Node, ship_code

DOWNLOAD_THREADS = 8
COPY_STREAMS = 4
STATE = os.path.join(".cache", "dsv41")


def _gb(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# ---- download ---------------------------------------------------------------------------------------

def _hub_error(err, cfg, endpoint):
    from huggingface_hub import errors as e
    import httpx2
    rev = cfg.revision or "main"
    if isinstance(err, e.GatedRepoError):
        return UserError(f"{cfg.hf_repo} is gated: accept its terms on the Hub, then set HF_TOKEN")
    if isinstance(err, e.RevisionNotFoundError):
        return UserError(f"REVISION={rev} is not in {cfg.hf_repo}: set REVISION to a commit, branch or tag "
                         f"of that repo")
    if isinstance(err, e.RepositoryNotFoundError):
        return UserError(f"HF_REPO={cfg.hf_repo} not found at {endpoint} (private? set HF_TOKEN)")
    if isinstance(err, e.HfHubHTTPError):
        code = err.response.status_code if err.response is not None else "?"
        hint = "set HF_TOKEN to a token with read access" if code in (401, 403) else "try again later"
        return UserError(f"the Hub answered HTTP {code} for {cfg.hf_repo}: {hint}")
    if isinstance(err, (httpx2.HTTPError, ConnectionError, TimeoutError)):
        return UserError(f"cannot reach the Hub at {endpoint}: {one_line(err, 160)}; check the network "
                         f"(or HF_ENDPOINT), then run `doit download` again: it resumes")
    return None


class _Bar:
    """Thread-safe facade over one tqdm bar, handed to huggingface_hub's http_get as its bar."""

    def __init__(self, bar):
        self.bar, self.lock = bar, threading.Lock()

    def update(self, n=1):
        with self.lock:
            self.bar.update(n)


def _etag(f):
    return f.lfs.sha256 if f.lfs is not None else f.blob_id


def download(cfg):
    """Fetch the repo at REVISION into MODEL_DIR, skipping what is already there (and the parts of shards
    already reassembled and verified), then verify. Returns the receipt."""
    os.environ.setdefault("HF_XET_HIGH_PERFORMANCE", "1")   # the fast (hf_xet) backend, when installed
    import huggingface_hub as hf
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import build_hf_headers, tqdm as hf_tqdm
    from huggingface_hub.utils._runtime import is_xet_available
    from huggingface_hub.file_download import http_get

    token = cfg.hf_token or None
    api = hf.HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    endpoint = api.endpoint
    model_dir = cfg.model_dir
    try:
        commit = api.model_info(cfg.hf_repo, revision=cfg.revision or None).sha
        tree = {f.path: f for f in api.list_repo_tree(cfg.hf_repo, recursive=True, revision=commit)
                if isinstance(f, RepoFile)}
    except Exception as err:  # noqa: BLE001 - mapped to one line or re-raised
        raise (_hub_error(err, cfg, endpoint) or err) from None
    if ck.MANIFEST not in tree:
        raise UserError(f"{cfg.hf_repo}@{commit[:12]} has no {ck.MANIFEST}: check HF_REPO and REVISION")
    os.makedirs(model_dir, exist_ok=True)
    state_dir = os.path.join(model_dir, STATE)
    records_file = os.path.join(state_dir, "download.json")
    try:
        with open(records_file) as fh:
            records = json.load(fh)
    except (FileNotFoundError, ValueError):
        records = {}
    lock = threading.Lock()
    checker = ck.Checkpoint(model_dir, ck.receipt_path(cfg.state_dir), cfg.keep_parts, cfg.plan_name)

    def incomplete(f):
        return os.path.join(state_dir, "download", f"{f.path}.{_etag(f)}.incomplete")

    def done(f, receipt):
        try:
            st = os.stat(os.path.join(model_dir, f.path))
        except OSError:
            return False
        if st.st_size != f.size:
            return False
        r = records.get(f.path)
        if r and r == {"etag": _etag(f), "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
        e = (receipt or {}).get("files", {}).get(f.path)
        return bool(f.lfs and e and e["sha256"] == f.lfs.sha256 and e["mtime_ns"] == st.st_mtime_ns)

    def fetch(f, bar):
        dest = os.path.join(model_dir, f.path)
        url = hf.hf_hub_url(cfg.hf_repo, f.path, revision=commit, endpoint=endpoint)
        meta = hf.get_hf_file_metadata(url, token=token, endpoint=endpoint)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if meta.xet_file_data is not None and is_xet_available():
            # The Hub's chunked storage (hf_xet): its own parallel, deduplicated and cached transfer.
            hf.hf_hub_download(cfg.hf_repo, f.path, revision=commit, local_dir=model_dir, token=token,
                               endpoint=endpoint)
            bar.update(f.size)
        else:
            inc = incomplete(f)
            os.makedirs(os.path.dirname(inc), exist_ok=True)
            headers = build_hf_headers(token=token)
            if urlparse(meta.location).netloc != urlparse(url).netloc:
                headers.pop("authorization", None)          # signed CDN URL: no token to a third party
            with open(inc, "ab") as out:
                if out.tell() > f.size:
                    out.truncate(0)
                http_get(meta.location, out, resume_size=out.tell(), headers=headers,
                         expected_size=f.size, displayed_filename=f.path, _tqdm_bar=bar)
                out.flush()
                os.fsync(out.fileno())
            os.replace(inc, dest)
        st = os.stat(dest)
        with lock:
            records[f.path] = {"etag": _etag(f), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            ck.write_json_atomic(records_file, records)

    def fetch_all(files):
        if not files:
            return
        files = sorted(files, key=lambda f: -f.size)
        have = sum(min(_size(incomplete(f)), f.size) for f in files)
        bar = hf_tqdm(total=sum(f.size for f in files), initial=have, unit="B", unit_scale=True,
                      desc=f"download {cfg.hf_repo}", name="huggingface_hub.snapshot_download")
        try:
            with cf.ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
                for fut in [pool.submit(fetch, f, _Bar(bar)) for f in files]:
                    try:
                        fut.result()
                    except UserError:
                        raise
                    except Exception as err:  # noqa: BLE001
                        if isinstance(err, OSError) and err.errno == 28:
                            raise UserError(f"MODEL_DIR {model_dir}: disk full while downloading; free space "
                                            f"and run `doit download` again (it resumes)") from None
                        raise (_hub_error(err, cfg, endpoint) or err) from None
        finally:
            bar.close()

    # 1. the manifest and the small metadata first: they decide what else is needed
    receipt = checker.load_receipt()
    first = [tree[p] for p in (ck.MANIFEST, *ck.REQUIRED) if p in tree and not done(tree[p], receipt)]
    fetch_all(first)
    manifest = ck.read_manifest(model_dir)

    # 2. shards already reassembled: verify them (hash only, no reassembly) so their parts are skipped
    groups = {}
    for f in tree.values():
        m = ck.PART_RE.match(os.path.basename(f.path))
        if m:
            groups.setdefault(os.path.join(os.path.dirname(f.path), m.group("base")), []).append(f)
    present = {b for b in groups if b in manifest and os.path.isfile(os.path.join(model_dir, b))}
    if present:
        checker.verify(only=present, assemble=False, strict=False)
    receipt = checker.load_receipt()
    verified = {b for b in present if checker._fresh_entry(receipt, b, manifest[b])}
    skip = {f.path for b in verified for f in groups[b]}

    # 3. free space: what is left to fetch plus the shards still to be rebuilt from parts
    todo = [f for f in tree.values() if f.path not in skip and not done(f, receipt)]
    fetch_bytes = sum(f.size - min(_size(incomplete(f)), f.size) for f in todo)
    rebuild = sum(f.size for b, fs in groups.items() if b in manifest and b not in verified for f in fs)
    need, free = fetch_bytes + rebuild, ck.free_bytes(model_dir)
    if need > free:
        raise UserError(f"MODEL_DIR {model_dir} needs {_gb(need)} free ({_gb(fetch_bytes)} to download "
                        f"+ {_gb(rebuild)} to reassemble shards) but has {_gb(free)}: free "
                        f"{_gb(need - free)} more or point MODEL_DIR at a bigger disk")
    print(f"download: {cfg.hf_repo}@{commit[:12]}: {len(todo)} file(s), {_gb(fetch_bytes)} to fetch"
          + (f"; parts of {len(verified)} verified shard(s) skipped" if verified else ""), file=sys.stderr)
    fetch_all(todo)

    # 4. the same steps as `doit verify`
    return ck.verify(cfg)


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# ---- copy to workers --------------------------------------------------------------------------------

_RUN_CHECKPOINT = ('d=$1; shift; case $d in "~"/*) d=$HOME/${d#"~/"};; esac; '
                   'export PYTHONPATH="$d"; exec python3 -m dsv41.checkpoint "$@"')


def _worker_paths(cfg, spec, home):
    return cfg.model_dir_on(spec, home), cfg.state_dir_on(spec, home)


def _probe(node, cfg, mdir, sdir):
    """One ssh call: the worker's `check --json` (code shipped by an earlier copy). None when the code
    is not there yet or answers nonsense."""
    argv = ["sh", "-c", _RUN_CHECKPOINT, "sh", f"{sdir}/lib", "check", mdir,
            "--receipt", ck.receipt_path(sdir), "--plan", cfg.plan_name, "--json"]
    r = node.run(argv, check=False)
    if r.code not in (0, 1):
        return None
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return None
    return out if isinstance(out, dict) and "fresh" in out else None


def same_copy(head, worker):
    """None when the worker's receipt shows the same verified checkpoint as the head's, else why not."""
    if not worker:
        return "no receipt on the worker"
    wf = worker.get("files", {})
    for rel, e in head.get("files", {}).items():
        if wf.get(rel, {}).get("sha256") != e["sha256"]:
            return f"{rel} differs or is not verified"
    if worker.get("exl3_files") != head.get("exl3_files"):
        return f"EXL3 file count {worker.get('exl3_files')} != head's {head.get('exl3_files')}"
    ho, wo = head.get("others", {}), worker.get("others", {})
    for rel in sorted(set(ho) | set(wo)):
        if rel not in wo or rel not in ho or wo[rel][0] != ho[rel][0]:
            return f"{rel} differs"
    return None


def fresh_on_workers(cfg):
    """doit uptodate: every worker holds a verified copy equal to the head's (one ssh call per worker)."""
    ok, reason, head, _ = ck.Checkpoint(cfg.model_dir, ck.receipt_path(cfg.state_dir), plan=cfg.plan_name).check()
    if not ok:
        return False
    for spec in cfg.workers:
        mdir, sdir = _worker_paths(cfg, spec, "~")
        try:
            probe = _probe(Node.from_spec(spec, cfg), cfg, mdir, sdir)
        except UserError:
            return False
        if not probe or not probe["fresh"] or same_copy(head, probe["receipt"]):
            return False
    return True


def copy(cfg):
    """Copy the verified checkpoint to every worker's model dir, verify it there, compare with the head."""
    workers = cfg.require_workers()
    head = ck.verify(cfg)
    for spec in workers:
        _copy_to(cfg, spec, head)


def _copy_to(cfg, spec, head):
    node = Node.from_spec(spec, cfg)
    mdir, sdir = _worker_paths(cfg, spec, node.home())
    probe, prefix = _probe(node, cfg, mdir, sdir), None
    if probe is None:                                     # first contact: ship the verifier, ask again
        prefix = ship_code(node, sdir)
        probe = _probe(node, cfg, mdir, sdir)
        if probe is None:
            raise UserError(f"{node.label}: cannot run python3 -m dsv41.checkpoint there: "
                            f"install python3 (>= 3.10)")
    if probe["fresh"] and not same_copy(head, probe["receipt"]):
        print(f"copy: {node.label} already holds a verified copy in {mdir}", file=sys.stderr)
        return
    prefix = prefix or ship_code(node, sdir)
    files = ck.listing(cfg.model_dir)
    wrec = probe["receipt"] or {}
    wfiles, failed = wrec.get("files", {}), wrec.get("failed", {})
    fresh, remote, partials = set(probe["fresh_files"]), probe["listing"], probe["partials"]
    groups = {"whole": [], "resume": [], "force": []}
    for rel, (size, mtime) in sorted(files.items()):
        hf = head["files"].get(rel)
        if hf and rel in fresh and wfiles.get(rel, {}).get("sha256") == hf["sha256"]:
            continue                                      # verified there with the same content
        if rel in failed and remote.get(rel) == failed[rel]:
            groups["force"].append(rel)                    # failed verification there: send again
        elif remote.get(rel) == [size, mtime]:
            continue                                      # sent before; the verify below hashes it
        elif rel in partials:
            groups["resume"].append(rel)
        else:
            groups["whole"].append(rel)
    send = [r for g in groups.values() for r in g]
    need = sum(files[r][0] - (partials.get(r, 0) if r in groups["resume"] else 0) for r in send)
    if need > probe["free"]:
        raise UserError(f"{node.label}: {mdir} needs {_gb(need)} free for the copy but has "
                        f"{_gb(probe['free'])}: free {_gb(need - probe['free'])} more or set "
                        f"WORKER_MODEL_DIR to a bigger disk")
    if send:
        print(f"copy: {len(send)} file(s), {_gb(need)} to {node.label}:{mdir}", file=sys.stderr)
        node.run(["mkdir", "-p", mdir])
        _rsync(node, cfg.model_dir, mdir, groups, files)
        _drop_cache(cfg.model_dir, send)
    rec = _remote_verify(node, prefix, mdir, sdir, cfg)
    why = same_copy(head, rec)
    if why:
        raise UserError(f"{node.label}: the copy in {mdir} does not match the head's: {why}; "
                        f"run `doit copy` again")
    print(f"copy: {node.label} verified ({len(rec['files'])} shards, {rec.get('exl3_files')} EXL3 files)",
          file=sys.stderr)


def _bins(rels, sizes, n):
    """Split files into n lists of about equal bytes (largest first)."""
    bins = [[0, []] for _ in range(max(1, min(n, len(rels))))]
    for rel in sorted(rels, key=lambda r: -sizes[r][0]):
        b = min(bins, key=lambda x: x[0])
        b[0] += sizes[rel][0]
        b[1].append(rel)
    return [b[1] for b in bins if b[1]]


def rsync_argv(node, src, dest, list_file, kind):
    argv = ["rsync", "-rlt", "--partial", f"--partial-dir={ck.PARTIAL_DIR}", "--from0",
            f"--files-from={list_file}", "--info=progress2", "--no-human-readable",
            "--exclude=.cache/", "--exclude=*.part[0-9][0-9]",
            "--no-whole-file" if kind == "resume" else "--whole-file",
            # the listing already showed these files differ: rsync's quick check (size and mtime to
            # the second) must not skip one rewritten within the same second
            *(["--ignore-times"] if kind in ("force", "whole") else []),
            "-e", shlex.join(node.ssh_command()), src.rstrip("/") + "/", node.rsync_target(dest.rstrip("/") + "/")]
    return (["nocache"] if shutil.which("nocache") else []) + argv


_PROGRESS_RE = re.compile(rb"^\s*([\d,]+)\s+\d+%")


def _rsync(node, src, dest, groups, sizes):
    """A few rsync processes over disjoint file lists (whole files; interrupted files resume from their
    partial), with one aggregate progress line."""
    total = sum(sizes[r][0] for g in groups.values() for r in g)
    progress = ck.Progress(f"copy to {node.name}", total)
    jobs = []
    with tempfile.TemporaryDirectory(prefix="dsv41-copy-") as tmp:
        for kind, rels in groups.items():
            for i, chunk in enumerate(_bins(rels, sizes, COPY_STREAMS)):
                lst = os.path.join(tmp, f"{kind}{i}")
                with open(lst, "wb") as f:
                    f.write(b"\0".join(os.fsencode(r) for r in chunk) + b"\0")
                jobs.append(rsync_argv(node, src, dest, lst, kind))
        procs, threads, counts = [], [], [0] * len(jobs)
        errs = [b""] * len(jobs)
        try:
            for i, argv in enumerate(jobs):
                p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                procs.append(p)
                for target, args in ((_read_progress, (p, i, counts, progress)), (_read_err, (p, i, errs))):
                    t = threading.Thread(target=target, args=args, daemon=True)
                    t.start()
                    threads.append(t)
            codes = [p.wait() for p in procs]
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            raise
        for t in threads:
            t.join()
        progress.close()
    for code, err in zip(codes, errs):
        if code:
            tail = one_line(err.decode(errors="replace")[-300:]) or "no output"
            raise UserError(f"{node.label}: rsync to {dest} failed (exit {code}): {tail}; "
                            f"run `doit copy` again (it resumes)")


def _read_progress(p, i, counts, progress):
    buf = b""
    while True:
        chunk = p.stdout.read1(65536) if hasattr(p.stdout, "read1") else p.stdout.read(65536)
        if not chunk:
            return
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for line in lines:
            m = _PROGRESS_RE.match(line)
            if m:
                n = int(m.group(1).replace(b",", b""))
                delta, counts[i] = n - counts[i], n
                if delta > 0:
                    progress.add(delta)


def _read_err(p, i, errs):
    errs[i] = p.stderr.read()


def _drop_cache(model_dir, rels):
    for rel in rels:
        try:
            fd = os.open(os.path.join(model_dir, rel), os.O_RDONLY)
        except OSError:
            continue
        try:
            ck._drop(fd)
        finally:
            os.close(fd)


def _remote_verify(node, prefix, mdir, sdir, cfg):
    """Run the shipped verifier on the worker, its progress streamed through; returns its receipt."""
    argv = node.argv_for(prefix + ["dsv41.checkpoint", "verify", mdir, "--receipt", ck.receipt_path(sdir),
                                   "--plan", cfg.plan_name, "--json",
                                   *(["--keep-parts"] if cfg.keep_parts else [])])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    last = []

    def relay():
        for line in iter(p.stderr.readline, b""):
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith("dsv41: "):
                last.append(text[len("dsv41: "):])
            else:
                print(f"{node.name}: {text}", file=sys.stderr)

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    out = p.stdout.read()
    code = p.wait()
    t.join()
    try:
        res = json.loads(out)
    except ValueError:
        res = None
    if code == 255 and not res:
        raise UserError(f"cannot reach {node.label} to verify the copy: check ssh and run `doit copy` again")
    if not res or not res.get("ok"):
        why = (res or {}).get("error") or (last[-1] if last else f"exit {code}")
        raise UserError(f"{node.label}: verification of the copy failed: {one_line(why)}; "
                        f"run `doit copy` again to resend it")
    return res["receipt"]
