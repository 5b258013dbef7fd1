"""The checkpoint on one node: reassemble split shards, verify every file named in the sha256 manifest,
keep a receipt (path, size, mtime, sha256) so a later run re-hashes only what changed.

Standard library only: this module is shipped to every node and run there as
  python3 -m dsv41.node.checkpoint verify|check MODEL_DIR --receipt FILE [--keep-parts] [--plan NAME] [--json]
                                   [--quiet | --machine-progress]
`check` compares the receipt with a stat of the files (exit 0: fresh, 1: not fresh); `verify` does the work.

What it reads of the model dir is in checkpoint_layout.py, how it streams the big files past the page
cache in checkpoint_io.py, its progress display in progress.py.
"""
import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import sys
import threading
import time

from dsv41.errors import UserError, cli
from dsv41.files import fsync_dir
from dsv41.node.checkpoint_io import Writer, hash_file, read_into
from dsv41.node.checkpoint_layout import (MANIFEST, REQUIRED, TMP_SUFFIX, count_bank_files, find_parts, listing,
                                          part_gap, partial_transfers, plan_banks, read_manifest, subdirs)
from dsv41.node import statefiles
from dsv41.node.progress import MachineProgress, Progress, no_progress

RECEIPT_VERSION = 1


def write_json_atomic(path, data):
    statefiles.write_json(path, data, indent=1, sort_keys=True)


# ---- verification ---------------------------------------------------------------------------------

class VerifyError(UserError):
    pass


def default_workers():
    return max(1, min(os.cpu_count() or 1, 8))


class Checkpoint:
    """progress: factory(label, total bytes) -> object with update(n) and close() (see Progress); default
    Progress, none with quiet."""

    def __init__(self, model_dir, receipt_file, keep_parts=False, plan=None, workers=None, quiet=False,
                 progress=None):
        self.dir = os.path.abspath(os.path.expanduser(model_dir))
        self.receipt_file = os.path.abspath(os.path.expanduser(receipt_file))
        self.keep_parts, self.plan = keep_parts, plan
        self.workers = workers or default_workers()
        self.progress = no_progress if quiet else (progress or Progress)
        self.lock = threading.Lock()

    def path(self, rel):
        return os.path.join(self.dir, rel)

    # receipt ------------------------------------------------------------------------------------
    def load_receipt(self):
        try:
            r = statefiles.read_object(self.receipt_file)
        except statefiles.Unreadable:           # verified again, and written anew
            return None
        if r is None or r.get("version") != RECEIPT_VERSION or r.get("model_dir") != self.dir:
            return None
        return r

    def _fresh_entry(self, receipt, rel, sha):
        e = (receipt or {}).get("files", {}).get(rel)
        if not e or e.get("sha256") != sha:
            return False
        try:
            st = os.stat(self.path(rel))
        except OSError:
            return False
        return st.st_size == e["size"] and st.st_mtime_ns == e["mtime_ns"]

    def _record(self, receipt, rel, sha):
        st = os.stat(self.path(rel))
        with self.lock:
            receipt["files"][rel] = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                     "sha256": sha}
            receipt.get("failed", {}).pop(rel, None)
            write_json_atomic(self.receipt_file, {k: v for k, v in receipt.items() if k != "errors"})

    def _record_failed(self, receipt, rel):
        """A file whose content is wrong although it looks complete: `doit copy` resends it."""
        st = os.stat(self.path(rel))
        with self.lock:
            receipt["files"].pop(rel, None)
            receipt.setdefault("failed", {})[rel] = [st.st_size, st.st_mtime_ns]

    # check --------------------------------------------------------------------------------------
    def check(self):
        """(fresh, reason, receipt, fresh_files): receipt against a stat of the files; no hashing."""
        receipt = self.load_receipt()
        if receipt is None:
            return False, f"no receipt for {self.dir} at {self.receipt_file}", None, []
        try:
            manifest = read_manifest(self.dir)
        except UserError as err:
            return False, str(err), receipt, []
        fresh = [rel for rel, sha in manifest.items() if self._fresh_entry(receipt, rel, sha)]
        stale = [rel for rel in manifest if rel not in fresh]
        if stale:
            return False, f"{stale[0]} is not verified (or changed since)", receipt, fresh
        if self.plan and receipt.get("plan") != self.plan:
            return False, f"plan {self.plan} not checked yet", receipt, fresh
        others = {k: list(v) for k, v in listing(self.dir).items() if k not in manifest}
        old = receipt.get("others") or {}
        if others != old:
            changed = sorted(set(others) ^ set(old)) or sorted(k for k in others if others[k] != old.get(k))
            return False, f"{changed[0]} changed since the last verify", receipt, fresh
        return True, "fresh", receipt, fresh

    # verify -------------------------------------------------------------------------------------
    def verify(self, only=None, assemble=True, strict=True):
        """Verify the manifest's files (all, or `only`), reassembling from parts where needed; update the
        receipt. strict: also require every file, the plan and its banks, and raise on any failure.
        Returns the receipt (with "errors" when not strict)."""
        if not os.path.isdir(self.dir):
            raise UserError(f"model dir {self.dir} does not exist: run `doit download` (or `doit copy`)")
        manifest = read_manifest(self.dir)
        receipt = self.load_receipt() or {"version": RECEIPT_VERSION, "model_dir": self.dir, "files": {}}
        receipt.pop("errors", None)
        names = [n for n in manifest if only is None or n in only]
        groups = find_parts(self.dir, manifest) if assemble else {}
        errors, jobs, cleanup = self._jobs_for(manifest, names, groups, receipt, strict)
        self._hash_jobs(receipt, jobs, groups, errors, cleanup)
        if not self.keep_parts:
            self._remove_parts(groups, cleanup)
        if strict:
            self._check_whole(receipt, manifest, errors)
        if errors:
            receipt["errors"] = errors
        with self.lock:
            write_json_atomic(self.receipt_file, {k: v for k, v in receipt.items() if k != "errors"})
        if errors and strict:
            more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
            raise VerifyError(errors[0] + more)
        return receipt

    def _jobs_for(self, manifest, names, groups, receipt, strict):
        """(errors, jobs, cleanup) before any hashing: stray parts and missing files are errors; a file the
        receipt holds fresh is skipped (its parts cleaned up); the rest are jobs (rel, sha, parts or None,
        whether the whole file exists), disk-bound rebuilds first, the biggest first."""
        errors, jobs, cleanup = [], [], []
        for base in sorted(groups):
            if base not in manifest:
                errors.append(f"{groups[base][0][1]}: {base} has no line in {MANIFEST}; "
                              f"remove the stray parts or download the manifest again")
        for rel in names:
            sha, parts = manifest[rel], groups.get(rel)
            if self._fresh_entry(receipt, rel, sha):
                if parts:
                    cleanup.append(rel)
                continue
            exists = os.path.isfile(self.path(rel))
            if parts:
                gap = part_gap(parts)
                if gap and not exists:
                    errors.append(f"{rel}: {gap}; run `doit download` to fetch it")
                    continue
                jobs.append((rel, sha, None if gap else parts, exists))
            elif exists:
                jobs.append((rel, sha, None, True))
            elif strict:
                errors.append(f"{rel} is missing (no file and no .partNN pieces in {self.dir}): "
                              f"run `doit download` or `doit copy`")
        jobs.sort(key=lambda j: (j[2] is None, -self._job_bytes(j)))   # disk-bound rebuilds first
        return errors, jobs, cleanup

    def _hash_jobs(self, receipt, jobs, groups, errors, cleanup):
        """Hash (and rebuild) every job on the worker threads under one progress display; a failure is
        appended to errors, a rebuilt file's name to cleanup."""
        total = sum(self._job_bytes(j) for j in jobs)
        progress = self.progress(f"verify {self.dir}", total)
        try:
            with cf.ThreadPoolExecutor(self.workers) as pool:
                futures = {pool.submit(self._job, receipt, j, progress): j[0] for j in jobs}
                for fut in cf.as_completed(futures):
                    rel = futures[fut]
                    try:
                        err = fut.result()
                    except OSError as e:
                        err = f"{rel}: {e.strerror or e} ({e.filename or self.path(rel)})"
                    if err:
                        errors.append(err)
                    elif groups.get(rel):
                        cleanup.append(rel)
        finally:
            progress.close()

    def _remove_parts(self, groups, cleanup):
        """The .partNN pieces of each verified file in cleanup are no longer needed."""
        for rel in cleanup:
            for _, part in groups[rel]:
                try:
                    os.unlink(self.path(part))
                except FileNotFoundError:
                    pass

    def _check_whole(self, receipt, manifest, errors):
        """Strict: the required files, the plan and its banks, recorded in the receipt with the files the
        manifest does not list and the time; what is missing is appended to errors."""
        try:
            for req in REQUIRED:
                if not os.path.isfile(self.path(req)):
                    raise UserError(f"{self.path(req)} is missing: download or copy the model again")
            banks = (plan_banks(self.dir, self.plan) if self.plan else
                     sorted(os.path.join("exl3", d) for d in subdirs(self.path("exl3")) if d != "plan"))
            receipt["exl3_files"] = count_bank_files(self.dir, banks)
            receipt["banks"] = banks
            receipt["plan"] = self.plan
        except UserError as err:
            errors.append(str(err))
        receipt["others"] = {k: list(v) for k, v in listing(self.dir).items() if k not in manifest}
        receipt["verified_at"] = int(time.time())

    def _job_bytes(self, job):
        rel, _, parts, exists = job
        try:
            if parts:
                return sum(os.path.getsize(self.path(p)) for _, p in parts) + (
                    os.path.getsize(self.path(rel)) if exists else 0)
            return os.path.getsize(self.path(rel))
        except OSError:
            return 0

    def _job(self, receipt, job, progress):
        rel, sha, parts, exists = job
        if exists:
            actual = hash_file(self.path(rel), progress)
            if actual == sha:
                self._record(receipt, rel, sha)
                return None
            if not parts:
                self._record_failed(receipt, rel)
                return (f"{rel}: sha256 mismatch: expected {sha}, got {actual}; the file is damaged: "
                        f"delete it and run `doit download` (or `doit copy` on a worker)")
        return self._assemble(receipt, rel, sha, parts, progress)

    def _assemble(self, receipt, rel, sha, parts, progress):
        """Join parts into a temp file while hashing them (one read, one write); fsync; rename only if
        the hash matches. A stale temp file from an interrupted run is simply overwritten."""
        dst = self.path(rel)
        tmp = os.path.join(os.path.dirname(dst), "." + os.path.basename(dst) + TMP_SUFFIX)
        h = hashlib.sha256()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        ok = False
        try:
            w = Writer(fd)

            def sink(mv):
                h.update(mv)
                w.write(mv)

            for _, part in parts:
                read_into(self.path(part), sink, progress)
            actual = h.hexdigest()
            if actual != sha:
                return (f"{rel}: sha256 of its {len(parts)} joined parts is {actual}, expected {sha}: "
                        f"a part is damaged or truncated; not installed (delete "
                        f"{os.path.basename(rel)}.part* and run `doit download`)")
            w.finish()
            ok = True
        finally:
            os.close(fd)
            if not ok:
                os.unlink(tmp)
        os.replace(tmp, dst)
        fsync_dir(os.path.dirname(dst))
        self._record(receipt, rel, sha)
        return None


def free_bytes(path):
    """Free bytes on the filesystem holding path (or its nearest existing parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return shutil.disk_usage(p).free


# ---- command line (runs on any node) --------------------------------------------------------------

@cli
def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m dsv41.node.checkpoint",
                                 description="Verify or check a checkpoint against its receipt.")
    ap.add_argument("command", choices=("verify", "check"))
    ap.add_argument("model_dir")
    ap.add_argument("--receipt", required=True)
    ap.add_argument("--keep-parts", action="store_true")
    ap.add_argument("--plan")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ap.add_argument("--quiet", action="store_true", help="no progress display")
    ap.add_argument("--machine-progress", action="store_true",
                    help="progress as `progress <done> <total>` lines (bytes) on stderr, for the head")
    a = ap.parse_args(argv)
    ck = Checkpoint(a.model_dir, a.receipt, a.keep_parts, a.plan, quiet=a.quiet,
                    progress=MachineProgress if a.machine_progress else None)
    if a.command == "check":
        fresh, reason, receipt, fresh_files = ck.check()
        if a.json:
            partials = {}
            for k, (size, _) in partial_transfers(ck.dir).items():
                partials[k] = size
            print(json.dumps({"fresh": fresh, "reason": reason, "receipt": receipt, "fresh_files": fresh_files,
                              "listing": listing(ck.dir) if os.path.isdir(ck.dir) else {},
                              "partials": partials, "free": free_bytes(ck.dir)}))
        elif not fresh:
            print(f"dsv41: not fresh: {reason}", file=sys.stderr)
        return 0 if fresh else 1
    try:
        receipt = ck.verify()
    except VerifyError as err:
        if a.json:
            print(json.dumps({"ok": False, "error": str(err)}))
        raise
    if a.json:
        print(json.dumps({"ok": True, "receipt": receipt}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
