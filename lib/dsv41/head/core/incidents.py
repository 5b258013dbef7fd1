"""Incident folders: what a failure looked like, saved on the head before anything is restarted.

    $STATE_DIR/incidents/<UTC time>-<verdict>/
        summary.json          schema dsv41.incident/1: time, verdict, evidence, fault_at (when the fault
                              began: the last progress seen, or the first failed look), ended, outage_s
                              (ended - fault_at), result, and per node what was gathered or why not
        metrics.txt           the engine's /metrics at the time
        <node>/...            that node's evidence (dsv41.node.evidence: rank journals, container state,
                              meminfo, biggest processes, kernel tail, py-spy stacks), <node>/evidence.json
                              its notes

Every node is asked at once, each within a deadline; a node that does not answer is named in the
summary. Nothing secret is written: the evidence never holds environments, and every file is also
scrubbed of the API key and HF_TOKEN values given to save(). The newest `keep` folders are kept.
list_lines() and show() print them for `doit incidents` and `doit incidents show [N|NAME]`: every incident
of the record (core.record, which opens one before its folder exists), each with its folder's summary.
"""
import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, wait

from dsv41.errors import UserError, one_line
from dsv41 import names
from dsv41.head.core import record, startup, statefiles

SCHEMA = "dsv41.incident/1"
DIR = names.INCIDENT_DIRS
FOLDER_RE = re.compile(r"^\d{8}T\d{6}Z-[A-Z_]+(-\d+)?$")
REDACTED = "<redacted>"


def root(state_dir):
    return os.path.join(state_dir, DIR)


# ---- gathering --------------------------------------------------------------------------------------

def evidence_request(cl, node, pids=()):
    """What dsv41.node.evidence looks at on a node: the recipe's containers and units there (and pids given)."""
    spec = cl.spec(node)
    return {"containers": list(cl.recipe.containers(spec)), "units": list(cl.recipe.units(spec)), "pids": list(pids)}


def gather_nodes(cl, deadline_s, pids=None):
    """{node name: evidence dict, or {"error": why}} from every node at once, each within deadline_s."""
    pids = pids or {}

    def one(node):
        req = evidence_request(cl, node, pids.get(node.name, ()))
        req["deadline_s"] = max(1, deadline_s - 5)
        argv = cl.module(node, "evidence", json.dumps(req))
        return json.loads(node.run(argv, timeout=deadline_s).stdout)

    pool = ThreadPoolExecutor(max_workers=max(1, len(cl.nodes)))
    futures = {n.name: pool.submit(one, n) for n in cl.nodes}
    wait(futures.values(), timeout=deadline_s + 2)
    out = {}
    for name, fut in futures.items():
        if not fut.done():
            out[name] = {"error": f"did not answer within {deadline_s} s: the node is frozen or its link is down"}
            continue
        try:
            out[name] = fut.result()
        except (UserError, ValueError, OSError) as err:
            out[name] = {"error": one_line(err, 300)}
    pool.shutdown(wait=False, cancel_futures=True)
    return out


def fetch_metrics(url, timeout_s=5.0, key=None):
    """The engine's /metrics text, or a line saying why there is none (a stopped API server: within the
    watchdog's own /health timeout, so its evidence does not hold up the restart). key: as metrics.scrape."""
    import requests
    try:
        r = requests.get(url, timeout=(min(2.0, timeout_s), timeout_s),
                         headers={"Authorization": f"Bearer {key}"} if key else {})
        return r.text if r.status_code == 200 else f"# {url} answered HTTP {r.status_code}\n"
    except requests.exceptions.RequestException as err:
        return f"# no answer from {url}: {one_line(err, 200)}\n"


def capture(cl, state_dir, verdict, evidence, *, fault_at, metrics_url, secrets, keep, node_deadline_s=30,
            pids=None, now=None, name=None, metrics_key=None):
    """Gather every node's evidence and the engine's /metrics (metrics_key: as fetch_metrics) at once, then
    save(); -> the folder."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        text = pool.submit(fetch_metrics, metrics_url, key=metrics_key)
        nodes = gather_nodes(cl, node_deadline_s, pids)
        metrics_text = text.result()
    return save(state_dir, verdict, evidence, nodes=nodes, metrics_text=metrics_text, fault_at=fault_at,
                secrets=secrets, keep=keep, now=now, name=name)


# ---- writing ------------------------------------------------------------------------------------------

def scrub(text, secrets):
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, REDACTED)
    return text


def _safe_name(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def folder_of(state_dir, name):
    return os.path.join(root(state_dir), name)


def save(state_dir, verdict, evidence, *, nodes, metrics_text, fault_at, secrets, keep, now=None, name=None):
    """Write one incident folder (0700, files 0600), named as its incident in the record (name) or by its
    time, and drop the oldest beyond `keep`; -> its path."""
    now = time.time() if now is None else now
    taken = set(statefiles.listdir(root(state_dir)))
    folder = folder_of(state_dir, name if name and name not in taken else record.incident_id(verdict, now, taken))
    os.makedirs(root(state_dir), mode=0o700, exist_ok=True)
    os.makedirs(folder, mode=0o700)

    def put(rel, text):
        statefiles.write_file(os.path.join(folder, rel), scrub(text, secrets), 0o600)

    gathered = {}
    for node, ev in nodes.items():
        if "error" in ev:
            gathered[node] = {"error": ev["error"]}
            continue
        for fname, text in ev.get("files", {}).items():
            put(os.path.join(_safe_name(node), _safe_name(fname)), text)
        meta = {k: v for k, v in ev.items() if k != "files"}
        put(os.path.join(_safe_name(node), "evidence.json"), json.dumps(meta, indent=1) + "\n")
        gathered[node] = {"files": sorted(ev.get("files", {})), "notes": meta.get("notes", []),
                          "took_s": meta.get("took_s"), "capped": meta.get("capped", False)}
    put("metrics.txt", metrics_text or "")
    summary = {"schema": SCHEMA, "time": now, "verdict": verdict, "evidence": evidence, "fault_at": fault_at,
               "ended": None, "outage_s": None, "result": "pending", "nodes": gathered}
    statefiles.write_summary(folder, summary)
    prune(state_dir, keep)
    return folder


def record_result(folder, result, ended=None):
    """The recovery's end: result, when the API served again (ended) and the outage since fault_at."""
    summary = statefiles.summary(folder)
    if summary is None:
        raise statefiles.bad(os.path.join(folder, names.INCIDENT_SUMMARY), "is missing")
    ended = time.time() if ended is None else ended
    start = summary.get("fault_at") or summary.get("time") or ended
    summary.update(result=result, ended=ended, outage_s=round(ended - start, 1))
    statefiles.write_summary(folder, summary)
    return summary


def folders(state_dir):
    """Incident folders, newest first."""
    found = [d for d in statefiles.listdir(root(state_dir)) if FOLDER_RE.match(d)]
    return [os.path.join(root(state_dir), d) for d in sorted(found, reverse=True)]


def prune(state_dir, keep):
    for old in folders(state_dir)[max(1, keep):]:
        shutil.rmtree(old, ignore_errors=True)


# ---- reading ------------------------------------------------------------------------------------------

def _summary(folder):
    """The folder's summary (statefiles.BadStateFile when it is not one); a folder without one (a kill
    while it was saved) says so."""
    found = statefiles.summary(folder)
    return {"verdict": os.path.basename(folder).split("-", 1)[-1], "result": "no summary.json"} if found is None else found


def entries(state_dir):
    """Every incident, newest first, as one dict: the record's incidents (open ones too), each with its
    folder's summary under it, then the folders no incident of the record names (earlier versions); with
    several serving groups also each group's (its records' folder: names.GROUP_RECORDS), its "group" named."""
    out = _entries(state_dir)
    for name in sorted(statefiles.listdir(os.path.join(state_dir, names.GROUP_RECORDS))):
        if names.GROUP_DIR_RE.fullmatch(name):
            out += [{**e, "group": name} for e in _entries(os.path.join(state_dir, names.GROUP_RECORDS, name))]
    return sorted(out, key=lambda e: e.get("time") or 0, reverse=True)


def _entries(state_dir):
    out, named = [], set()
    for inc in record.incidents(state_dir):
        folder = inc.get("folder") or (os.path.basename(inc["incident"]) if inc.get("incident") else None)
        path = folder_of(state_dir, folder) if folder and os.path.isdir(folder_of(state_dir, folder)) else None
        named.add(folder)
        summary = _summary(path) if path else {}
        start = inc.get("fault_at") or inc.get("started")
        outage = summary.get("outage_s") or (round(inc["ended"] - start, 1) if inc.get("ended") and start else None)
        out.append({**summary, "time": inc.get("started"), "verdict": inc.get("verdict"),
                    "evidence": inc.get("evidence"), "fault_at": inc.get("fault_at"), "ended": inc.get("ended"),
                    "outage_s": outage, "name": inc.get("id"), "folder": path, "action": inc.get("action"),
                    "startup": inc.get("startup"),
                    "result": ("open: " + (inc.get("phase") or "?")) if inc.get("open") else inc.get("result")})
    for path in folders(state_dir):
        if os.path.basename(path) not in named:
            out.append({**_summary(path), "name": os.path.basename(path), "folder": path})
    return out


def _when(t):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"


def _secs(s):
    return "-" if s is None else f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def list_lines(state_dir):
    """`doit incidents`: one line per incident, newest first (N: what `show N` takes)."""
    rows = entries(state_dir)
    if not rows:
        return [f"no incidents in {root(state_dir)}"]
    lines = [f"{'N':>3}  {'time (UTC)':<20}  {'verdict':<12}  {'outage':>8}  {'result':<24}  evidence"]
    for i, s in enumerate(rows, 1):
        verdict = (s.get("verdict") or "?") + (f" {s['group']}" if s.get("group") else "")
        lines.append(f"{i:>3}  {_when(s.get('time')):<20}  {verdict:<12}  {_secs(s.get('outage_s')):>8}  "
                     f"{one_line(s.get('result') or '-', 24):<24}  {one_line(s.get('evidence') or '', 100)}")
    return lines


def show(state_dir, n=1):
    """`doit incidents show [N|NAME]`: the N-th newest incident (1: the last), or the one of that name (its
    folder's), with its stacks; UserError when there is no such incident."""
    rows = entries(state_dir)
    match = [r for r in rows if r.get("name") == n] if isinstance(n, str) else rows[n - 1:n] if n >= 1 else []
    if not match:
        raise UserError(f"no incident {n}: {len(rows)} saved in {root(state_dir)} (`doit incidents` lists them)")
    s = match[0]
    folder = s.get("folder")
    out = [f"incident {s.get('name') or '?'}" + (f" of group {s['group'][1:]}" if s.get("group") else "")
           + f": {folder or 'no evidence folder'}",
           f"  verdict   {s.get('verdict') or '?'}: {s.get('evidence') or '-'}",
           f"  seen      {_when(s.get('time'))}   fault began {_when(s.get('fault_at'))}",
           f"  result    {s.get('result') or '-'}   served again {_when(s.get('ended'))}   outage {_secs(s.get('outage_s'))}"]
    if s.get("startup"):                    # a recovery that served (an older record has none)
        out += startup.lines(s.get("startup"))
    for node, g in (s.get("nodes") or {}).items():
        if "error" in g:
            out.append(f"  {node}: no evidence: {g['error']}")
            continue
        took = "-" if g.get("took_s") is None else f"{g['took_s']} s"
        out.append(f"  {node}: {len(g.get('files') or [])} files in {took}"
                   + (" (size cap reached)" if g.get("capped") else ""))
        out += [f"    note: {note}" for note in g.get("notes") or []]
    walk = sorted(os.walk(folder)) if folder else []
    for dirpath, _, files in walk:
        for fname in sorted(files):
            path = os.path.join(dirpath, fname)
            out.append(f"    {os.path.relpath(path, folder):<40} {os.path.getsize(path):>9} bytes")
    for dirpath, _, files in walk:
        for fname in sorted(f for f in files if f.startswith("pyspy-")):
            text = (statefiles.read_bytes(os.path.join(dirpath, fname)) or b"").decode(errors="replace")
            out += ["", f"== {os.path.relpath(os.path.join(dirpath, fname), folder)}", text.rstrip()]
    return "\n".join(out)
