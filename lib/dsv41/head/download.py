"""doit download: the checkpoint from the Hub (huggingface_hub) into MODEL_DIR, resumable, never
fetching what is already there nor the parts of shards already reassembled and verified; then the
same verification as `doit verify`."""
import concurrent.futures as cf
import json
import os
import sys
import threading
from urllib.parse import urlparse

from dsv41.errors import UserError, one_line
from dsv41.head.verify import checkpoint, gb, verify
from dsv41.node import checkpoint as ck

DOWNLOAD_THREADS = 8
STATE = os.path.join(".cache", "dsv41")


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
    checker = checkpoint(cfg)

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
        raise UserError(f"MODEL_DIR {model_dir} needs {gb(need)} free ({gb(fetch_bytes)} to download "
                        f"+ {gb(rebuild)} to reassemble shards) but has {gb(free)}: free "
                        f"{gb(need - free)} more or point MODEL_DIR at a bigger disk")
    print(f"download: {cfg.hf_repo}@{commit[:12]}: {len(todo)} file(s), {gb(fetch_bytes)} to fetch"
          + (f"; parts of {len(verified)} verified shard(s) skipped" if verified else ""), file=sys.stderr)
    fetch_all(todo)

    # 4. the same steps as `doit verify`
    return verify(cfg)


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
