"""doit download: the checkpoint from the Hub into MODEL_DIR, resumable, never fetching what is already there
nor the parts of shards already reassembled and verified; then the same verification as `doit verify`.

huggingface_hub only through its public, documented API (tests/test_download.py fails on a private import):
- HfApi.model_info pins REVISION to a commit; HfApi.list_repo_tree lists every file with its size and hashes.
- hf_hub_download(local_dir=MODEL_DIR, force_download=True, tqdm_class=...) fetches the small files kept in git
  and, when hf_xet is installed, the files on the Hub's Xet storage (its own parallel transfer, with
  HF_XET_HIGH_PERFORMANCE). It keeps its metadata in MODEL_DIR/.cache/huggingface/.
- huggingface_hub 2.4.0 does not resume: hf_hub_download writes to a temp file unique to the process and
  deletes it on failure (a killed run leaves it behind, never reused). So the large files that travel as
  plain HTTP (LFS without Xet, or no hf_xet) are fetched here, from the location get_hf_file_metadata reports,
  through huggingface_hub's HTTP session, into MODEL_DIR/.cache/dsv41/download/<path>.<sha256>.incomplete,
  continuing with a Range request from its end after an interruption; the token is not sent to a CDN on
  another host. The temp files a killed hf_hub_download left behind are deleted first (the run lock keeps
  other downloads out).
- Every transfer feeds one progress bar (dsv41.head.core.progress); huggingface_hub draws none of its own.
"""
import concurrent.futures as cf
import importlib.util
import os
import sys
import threading
import time
from urllib.parse import urlparse

from dsv41.errors import UserError, one_line
from dsv41.head.core import progress, statefiles
from dsv41.head.core.verify import checkpoint, gb, verify
from dsv41.node import checkpoint as ck, checkpoint_layout as layout

DOWNLOAD_THREADS = 8
HF_PARTIALS = os.path.join(".cache", "huggingface", "download")
RETRIES = 5                     # consecutive failed attempts without a byte received, then give up


def _causes(err):
    """err and what it was raised from: hf_hub_download(force_download=True) reports a failed metadata
    request as a ValueError raised from the real error."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__


def _hub_error(err, cfg, endpoint):
    from huggingface_hub import errors as e
    import httpx2
    rev = cfg.revision or "main"
    for err in _causes(err):
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


def _etag(f):
    return f.lfs.sha256 if f.lfs is not None else f.blob_id


def _xet_ready():
    """hf_hub_download would move Xet files with hf_xet (installed, not switched off)."""
    from huggingface_hub import constants
    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


def _tqdm_class(bar):
    """The tqdm_class hf_hub_download takes (documented: it must mimic tqdm): each bar huggingface_hub opens
    for a file adds to our one bar instead of drawing its own."""

    class FileBar:
        def __init__(self, *args, **kwargs):
            self.total, self.n = kwargs.get("total"), 0

        def update(self, n=1):
            self.n += n or 0
            bar.update(n or 0)

        def update_transfer(self, n=1):           # Xet: bytes on the wire; the bar counts bytes written
            pass

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def __getattr__(self, name):              # set_postfix_str, refresh, ...: nothing to draw
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *a, **k: None

    return FileBar


class _Stopped(Exception):
    """Another transfer failed: this one stops where it is (its .incomplete file stays for the next run)."""


def download(cfg):
    """Fetch the repo at REVISION into MODEL_DIR, skipping what is already there (and the parts of shards
    already reassembled and verified), then verify. Returns the receipt."""
    os.environ.setdefault("HF_XET_HIGH_PERFORMANCE", "1")   # hf_xet's fast mode; read when it is imported
    run = _Download(cfg)
    run.pin()                                                   # REVISION -> a commit, and its files
    receipt = run.fetch_metadata()                              # 1. the manifest and the small metadata
    groups, verified, receipt = run.verify_assembled(receipt)   # 2. shards already reassembled
    run.fetch_all(run.rest(groups, verified, receipt))          # 3. free space, then everything else
    return verify(cfg)                                          # 4. the same steps as `doit verify`


class _Download:
    """One run of `doit download`: the repo pinned to a commit, its files (tree: {path: RepoFile}), the
    records of what earlier runs fetched (MODEL_DIR/.cache/dsv41/download.json), and the checkpoint."""

    def __init__(self, cfg):
        import huggingface_hub as hf
        self.cfg, self.hf, self.model_dir = cfg, hf, cfg.model_dir
        self.token = cfg.hf_token or None
        self.api = hf.HfApi(endpoint=cfg.hf_endpoint or None, token=self.token)
        self.endpoint = self.api.endpoint
        self.state_dir = statefiles.download_dir(self.model_dir)   # partial downloads, the records
        self.commit, self.tree, self.records, self.manifest = None, {}, {}, {}
        self.lock = threading.Lock()
        self.checker = checkpoint(cfg)
        self.xet = _xet_ready()

    # ---- the steps, in order ---------------------------------------------------------------------

    def pin(self):
        """REVISION pinned to a commit, every file at it listed, and the records of earlier runs read."""
        cfg = self.cfg
        try:
            self.commit = self.api.model_info(cfg.hf_repo, revision=cfg.revision or None).sha
            self.tree = {f.path: f for f in self.api.list_repo_tree(cfg.hf_repo, recursive=True, revision=self.commit)
                         if isinstance(f, self.hf.RepoFile)}
        except Exception as err:  # noqa: BLE001 - mapped to one line or re-raised
            raise (_hub_error(err, cfg, self.endpoint) or err) from None
        if layout.MANIFEST not in self.tree:
            raise UserError(f"{cfg.hf_repo}@{self.commit[:12]} has no {layout.MANIFEST}: check HF_REPO and REVISION")
        os.makedirs(self.model_dir, exist_ok=True)
        self.records = statefiles.download_records(self.model_dir)

    def fetch_metadata(self):
        """The manifest and the small metadata first: they decide what else is needed (the manifest is
        read once they are here). -> the receipt."""
        receipt = self.checker.load_receipt()
        first = [self.tree[p] for p in (layout.MANIFEST, *layout.REQUIRED)
                 if p in self.tree and not self.done(self.tree[p], receipt)]
        self.fetch_all(first)
        self.manifest = layout.read_manifest(self.model_dir)
        return receipt

    def verify_assembled(self, receipt):
        """Shards already reassembled are verified (hash only, no reassembly) so their parts are skipped.
        -> ({shard: its parts}, the shards verified, the receipt)."""
        groups = {}
        for f in self.tree.values():
            m = layout.PART_RE.match(os.path.basename(f.path))
            if m:
                groups.setdefault(os.path.join(os.path.dirname(f.path), m.group("base")), []).append(f)
        present = {b for b in groups if b in self.manifest and os.path.isfile(os.path.join(self.model_dir, b))}
        if present:
            receipt = self.checker.verify(only=present, assemble=False, strict=False)
        verified = {b for b in present if self.checker._fresh_entry(receipt, b, self.manifest[b])}
        return groups, verified, receipt

    def rest(self, groups, verified, receipt):
        """What is left to fetch, once the free space for it and for the shards still to be rebuilt from
        parts is there (a UserError saying how much is missing otherwise)."""
        skip = {f.path for b in verified for f in groups[b]}
        _drop_stale_hub_partials(self.model_dir)
        todo = [f for f in self.tree.values() if f.path not in skip and not self.done(f, receipt)]
        fetch_bytes = sum(f.size - self.resumed(f) for f in todo)
        rebuild = sum(f.size for b, fs in groups.items() if b in self.manifest and b not in verified for f in fs)
        need, free = fetch_bytes + rebuild, ck.free_bytes(self.model_dir)
        if need > free:
            raise UserError(f"MODEL_DIR {self.model_dir} needs {gb(need)} free ({gb(fetch_bytes)} to download "
                            f"+ {gb(rebuild)} to reassemble shards) but has {gb(free)}: free "
                            f"{gb(need - free)} more or point MODEL_DIR at a bigger disk")
        print(f"download: {self.cfg.hf_repo}@{self.commit[:12]}: {len(todo)} file(s), {gb(fetch_bytes)} to fetch"
              + (f"; parts of {len(verified)} verified shard(s) skipped" if verified else ""), file=sys.stderr)
        return todo

    # ---- one file ----------------------------------------------------------------------------------

    def by_hub_download(self, f):
        """Small git files, and Xet files when hf_xet moves them; the rest resumes here over HTTP."""
        return f.lfs is None or (f.xet_hash is not None and self.xet)

    def incomplete(self, f):
        return os.path.join(self.state_dir, "download", f"{f.path}.{_etag(f)}.incomplete")

    def resumed(self, f):
        """Bytes of f already here from an interrupted run (hf_hub_download never resumes)."""
        return 0 if self.by_hub_download(f) else min(_size(self.incomplete(f)), f.size)

    def done(self, f, receipt):
        try:
            st = os.stat(os.path.join(self.model_dir, f.path))
        except OSError:
            return False
        if st.st_size != f.size:
            return False
        r = self.records.get(f.path)
        if r and r == {"etag": _etag(f), "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
        e = (receipt or {}).get("files", {}).get(f.path)
        return bool(f.lfs and e and e["sha256"] == f.lfs.sha256 and e["mtime_ns"] == st.st_mtime_ns)

    def source(self, f):
        """(location, request headers) of a file fetched here over HTTP: where the Hub redirects, with no
        token sent to a signed CDN URL on another host."""
        from huggingface_hub.utils import build_hf_headers
        url = self.hf.hf_hub_url(self.cfg.hf_repo, f.path, revision=self.commit, endpoint=self.endpoint)
        location = self.hf.get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint).location
        headers = build_hf_headers(token=self.token)
        headers["Accept-Encoding"] = "identity"
        if urlparse(location).netloc != urlparse(url).netloc:
            headers.pop("authorization", None)              # signed CDN URL: no token to a third party
        return location, headers

    def fetch_http(self, f, dest, bar, stop):
        """Stream the file into its .incomplete file, resuming from its end; retried while bytes arrive."""
        location, headers = self.source(f)
        inc = self.incomplete(f)
        os.makedirs(os.path.dirname(inc), exist_ok=True)
        with open(inc, "ab") as out:
            if out.tell() > f.size:
                out.seek(0)
                out.truncate()
            _receive(out, f.size, location, headers, bar, stop)
            if out.tell() != f.size:
                got = out.tell()
                out.seek(0)
                out.truncate()
                raise UserError(f"the Hub sent {got} bytes of {f.path}, {f.size} expected: run `doit download` "
                                f"again")
            out.flush()
            os.fsync(out.fileno())
        os.replace(inc, dest)

    def fetch(self, f, bar, stop):
        if stop.is_set():
            raise _Stopped()
        dest = os.path.join(self.model_dir, f.path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if self.by_hub_download(f):
            self.hf.hf_hub_download(self.cfg.hf_repo, f.path, revision=self.commit, local_dir=self.model_dir,
                                    token=self.token, endpoint=self.endpoint, force_download=True,
                                    tqdm_class=_tqdm_class(bar))
        else:
            self.fetch_http(f, dest, bar, stop)
        st = os.stat(dest)
        with self.lock:
            self.records[f.path] = {"etag": _etag(f), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            statefiles.write_download_records(self.model_dir, self.records)

    # ---- many files at once -------------------------------------------------------------------------

    def fetch_all(self, files):
        if not files:
            return
        files = sorted(files, key=lambda f: -f.size)
        have = sum(self.resumed(f) for f in files)
        stop = threading.Event()
        with progress.bar(f"download {self.cfg.hf_repo}", sum(f.size for f in files), initial=have) as bar, \
                cf.ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            futures = [pool.submit(self.fetch, f, bar, stop) for f in files]
            try:
                for fut in cf.as_completed(futures):
                    fut.result()
            except UserError:
                raise
            except Exception as err:  # noqa: BLE001
                if isinstance(err, OSError) and err.errno == 28:
                    raise UserError(f"MODEL_DIR {self.model_dir}: disk full while downloading; free space "
                                    f"and run `doit download` again (it resumes)") from None
                raise (_hub_error(err, self.cfg, self.endpoint) or err) from None
            finally:
                stop.set()                                    # no-op when all are done; else stop the rest
                for fut in futures:
                    fut.cancel()


def _receive(out, size, location, headers, bar, stop):
    """GET location into `out` (open for appending) until it holds `size` bytes, each attempt a Range
    request from its end; a dropped or stalled transfer is retried while bytes arrive (RETRIES in a row
    without a byte: a transport error is raised, an early end just stops; the caller checks the size)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status
    import httpx2
    failures = 0
    while out.tell() < size:
        have = out.tell()
        try:
            with get_session().stream("GET", location, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                      headers={**headers, **({"Range": f"bytes={have}-"} if have else {})}
                                      ) as r:
                hf_raise_for_status(r)
                if have and r.status_code != 206:     # the Range was ignored: start over
                    out.seek(0)
                    out.truncate()
                    bar.update(-have)
                for chunk in r.iter_bytes():          # as received: a drop loses nothing
                    if stop.is_set():
                        raise _Stopped()
                    out.write(chunk)
                    bar.update(len(chunk))
                    failures = 0
        except httpx2.TransportError:                 # dropped, timed out: resume from here
            failures += 1
            if failures >= RETRIES:
                raise
            time.sleep(1)
            continue
        if out.tell() == have:                        # ended early, not a byte: not forever
            failures += 1
            if failures >= RETRIES:
                break


def _drop_stale_hub_partials(model_dir):
    """Delete the temp files of hf_hub_download runs that were killed: huggingface_hub 2.4.0 never resumes
    from them (each run writes its own), so they only take space."""
    for root, _, names in os.walk(os.path.join(model_dir, HF_PARTIALS)):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
