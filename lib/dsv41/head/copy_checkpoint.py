"""doit copy: the verified checkpoint from the head to every worker's model dir over the fabric
(rsync through the node's ssh), verified there by the shipped verifier and compared with the head's
receipt. Resumable: rsync partials, and receipts so verified files are never sent or hashed again."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import NamedTuple

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core import commands, progress
from dsv41.head.core.cluster import ship_code
from dsv41.head.core.nodes import Node, end, spawn
from dsv41.head.core.verify import checkpoint, gb, verify
from dsv41.node import checkpoint_layout as layout
from dsv41.node.checkpoint_io import drop

COPY_STREAMS = 4


def _worker_paths(cfg, spec, node):
    home = node.home()
    return cfg.model_dir_on(spec, home), cfg.state_dir_on(spec, home)


def _checkpoint_argv(cfg, sdir, cmd, mdir, *extra):
    """The worker's shipped `dsv41.node.checkpoint CMD MDIR` on its receipt and plan, as JSON."""
    return commands.node_python(sdir) + ["dsv41.node.checkpoint", cmd, mdir, "--receipt",
                                         names.state_path(sdir, names.RECEIPT), "--plan", cfg.plan_name,
                                         "--json", *extra]


def _probe(node, cfg, mdir, sdir):
    """One ssh call: the worker's `check --json` (code shipped by an earlier copy). None when the code
    is not there yet or answers nonsense."""
    argv = _checkpoint_argv(cfg, sdir, "check", mdir)
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
    """doit uptodate: every worker holds a verified copy equal to the head's (two ssh calls per worker:
    its home, then the probe)."""
    ok, reason, head, _ = checkpoint(cfg).check()
    if not ok:
        return False
    for spec in cfg.workers:
        node = Node.from_spec(spec, cfg)
        try:
            probe = _probe(node, cfg, *_worker_paths(cfg, spec, node))
        except UserError:
            return False
        if not probe or not probe["fresh"] or same_copy(head, probe["receipt"]):
            return False
    return True


def copy(cfg):
    """Copy the verified checkpoint to every worker's model dir at once, verify it on each, compare
    with the head's receipt."""
    workers = cfg.require_workers()
    head = verify(cfg)
    files = layout.listing(cfg.model_dir)
    todo = [t for t in (_plan(cfg, spec, head, files) for spec in workers) if t]
    sending = [t for t in todo if t.send]
    if sending:
        for t in sending:
            print(f"copy: {len(t.send)} file(s), {gb(t.need)} to {t.node.label}:{t.mdir}", file=sys.stderr)
            t.node.run(commands.mkdir(t.mdir))
        _rsync(sending, cfg.model_dir, files)
        _drop_cache(cfg.model_dir, {r for t in sending for r in t.send})
    checks = [_start_verify(t.node, t.mdir, t.sdir, cfg) for t in todo]
    for t, check in zip(todo, checks):
        rec = _finish_verify(check)
        why = same_copy(head, rec)
        if why:
            raise UserError(f"{t.node.label}: the copy in {t.mdir} does not match the head's: {why}; "
                            f"run `doit copy` again")
        print(f"copy: {t.node.label} verified ({len(rec['files'])} shards, {rec.get('exl3_files')} EXL3 files)",
              file=sys.stderr)


class Transfer(NamedTuple):
    node: Node
    mdir: str
    sdir: str
    groups: dict          # "whole", "resume", "force" -> [relative paths]
    need: int             # bytes to send

    @property
    def send(self):
        return [r for g in self.groups.values() for r in g]


def _plan(cfg, spec, head, files):
    """What one worker lacks (a Transfer), or None when it already holds a verified copy."""
    node = Node.from_spec(spec, cfg)
    mdir, sdir = _worker_paths(cfg, spec, node)
    probe, shipped = _probe(node, cfg, mdir, sdir), False
    if probe is None:                                     # first contact: ship the verifier, ask again
        ship_code(node, sdir)
        probe, shipped = _probe(node, cfg, mdir, sdir), True
        if probe is None:
            raise UserError(f"{node.label}: cannot run python3 -m dsv41.node.checkpoint there: "
                            f"install python3 (>= 3.10)")
    if probe["fresh"] and not same_copy(head, probe["receipt"]):
        print(f"copy: {node.label} already holds a verified copy in {mdir}", file=sys.stderr)
        return None
    if not shipped:
        ship_code(node, sdir)                             # the verifier is this version's
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
            continue                                      # sent before; the verify hashes it
        elif rel in partials:
            groups["resume"].append(rel)
        else:
            groups["whole"].append(rel)
    need = sum(files[r][0] - (partials.get(r, 0) if r in groups["resume"] else 0) for g in groups.values() for r in g)
    if need > probe["free"]:
        raise UserError(f"{node.label}: {mdir} needs {gb(need)} free for the copy but has "
                        f"{gb(probe['free'])}: free {gb(need - probe['free'])} more or set "
                        f"WORKER_MODEL_DIR to a bigger disk")
    return Transfer(node, mdir, sdir, groups, need)


def _bins(rels, sizes, n):
    """Split files into n lists of about equal bytes (largest first)."""
    bins = [[0, []] for _ in range(max(1, min(n, len(rels))))]
    for rel in sorted(rels, key=lambda r: -sizes[r][0]):
        b = min(bins, key=lambda x: x[0])
        b[0] += sizes[rel][0]
        b[1].append(rel)
    return [b[1] for b in bins if b[1]]


def rsync_argv(node, src, dest, list_file, kind):
    argv = ["rsync", "-rlt", "--partial", f"--partial-dir={layout.PARTIAL_DIR}", "--from0",
            f"--files-from={list_file}", "--info=progress2", "--no-human-readable",
            "--exclude=.cache/", "--exclude=*.part[0-9][0-9]",
            "--no-whole-file" if kind == "resume" else "--whole-file",
            # the listing already showed these files differ: rsync's quick check (size and mtime to
            # the second) must not skip one rewritten within the same second
            *(["--ignore-times"] if kind in ("force", "whole") else []),
            "-e", shlex.join(node.ssh_command()), "--", src.rstrip("/") + "/",
            node.rsync_target(dest.rstrip("/") + "/")]
    return (["nocache"] if shutil.which("nocache") else []) + argv


_PROGRESS_RE = re.compile(rb"^\s*([\d,]+)\s+\d+%")


def _rsync(transfers, src, sizes):
    """A few rsync processes per worker over disjoint file lists, every worker at once (whole files;
    interrupted files resume from their partial), with one aggregate progress bar."""
    total = sum(sizes[r][0] for t in transfers for r in t.send)
    jobs = []
    with (progress.bar(f"copy to {', '.join(t.node.name for t in transfers)}", total) as bar,
          tempfile.TemporaryDirectory(prefix="dsv41-copy-") as tmp):
        for t in transfers:
            for kind, rels in t.groups.items():
                for i, chunk in enumerate(_bins(rels, sizes, COPY_STREAMS)):
                    lst = os.path.join(tmp, f"{t.node.name}-{kind}{i}")
                    with open(lst, "wb") as f:
                        f.write(b"\0".join(os.fsencode(r) for r in chunk) + b"\0")
                    jobs.append((t, rsync_argv(t.node, src, t.mdir, lst, kind)))
        procs, threads, counts = [], [], [0] * len(jobs)
        errs = [b""] * len(jobs)
        try:
            for i, (_, argv) in enumerate(jobs):
                p = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                procs.append(p)
                for target, args in ((_read_progress, (p, i, counts, bar)), (_read_err, (p, i, errs))):
                    th = threading.Thread(target=target, args=args, daemon=True)
                    th.start()
                    threads.append(th)
            codes = [p.wait() for p in procs]
        except BaseException:
            for p in procs:
                end(p)
            raise
        for th in threads:
            th.join()
    for (t, _), code, err in zip(jobs, codes, errs):
        if code:
            tail = one_line(err.decode(errors="replace")[-300:]) or "no output"
            raise UserError(f"{t.node.label}: rsync to {t.mdir} failed (exit {code}): {tail}; "
                            f"run `doit copy` again (it resumes)")


def _read_progress(p, i, counts, bar):
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
                    bar.update(delta)


def _read_err(p, i, errs):
    errs[i] = p.stderr.read()


def _drop_cache(model_dir, rels):
    for rel in rels:
        try:
            fd = os.open(os.path.join(model_dir, rel), os.O_RDONLY)
        except OSError:
            continue
        try:
            drop(fd)
        finally:
            os.close(fd)


_NODE_PROGRESS_RE = re.compile(r"^progress (\d+) (\d+)$")


def _start_verify(node, mdir, sdir, cfg):
    """Start the shipped verifier on a worker; its `progress <done> <total>` lines (--machine-progress)
    drive this head's bar, its other stderr lines are passed through. _finish_verify collects it."""
    argv = node.argv_for(_checkpoint_argv(cfg, sdir, "verify", mdir, "--machine-progress",
                                          *(["--keep-parts"] if cfg.keep_parts else [])))
    p = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    last, bars = [], []

    def relay():
        done = 0
        for line in iter(p.stderr.readline, b""):
            text = line.decode(errors="replace").rstrip("\n")
            m = _NODE_PROGRESS_RE.match(text)
            if m:
                n, total = int(m.group(1)), int(m.group(2))
                if not bars:
                    bars.append(progress.bar(f"verify on {node.name}", total))
                bars[0].update(n - done)
                done = n
            elif text.startswith("dsv41: "):
                last.append(text[len("dsv41: "):])
            else:
                print(f"{node.name}: {text}", file=sys.stderr)

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    return node, p, t, last, bars


def _finish_verify(check):
    """Wait for a verifier started by _start_verify; returns the worker's receipt."""
    node, p, t, last, bars = check
    try:
        out = p.stdout.read()
        code = p.wait()
        t.join()
    finally:
        for b in bars:
            b.close()
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
