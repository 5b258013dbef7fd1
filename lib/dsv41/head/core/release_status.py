"""The release history as `doit status` and `doit top` show it: one entry (the release in service,
the newest that failed after it, one rolling out) and its line. The records are core.releases'."""
from dsv41.errors import UserError, one_line
from dsv41.head.core.releases import in_service, load_all, short_id, unfinished, when


def _brief(r):
    return r and {"number": r.number, "state": r.shown_state, "began": r.time, "image": r.image,
                  "result": r.result, "failed_at": r.failed_at, "rolled_back_to": r.rolled_back_to}


def service_entry(state_dir):
    """What `doit status` and `doit top` show of the history: {"serving", "failed" (the newest that failed
    after it), "rolling_out"} (each a release's brief or None), or {"error": line}."""
    try:
        history = load_all(state_dir)
        serving, failed = in_service(state_dir)
    except UserError as err:
        return {"error": str(err)}
    return {"serving": _brief(serving), "failed": _brief(failed), "rolling_out": _brief(unfinished(history))}


def service_line(e):
    """The entry as one line."""
    if "error" in e:
        return f"release: {e['error']}"
    s, f, u = e["serving"], e["failed"], e["rolling_out"]
    line = (f"release {s['number']} in service (began {when(s['began'])}, image {short_id(s['image'])})" if s
            else "release: none in service yet (`doit launch` records one)")
    if f:
        line += (f"; release {f['number']} failed at {when(f['failed_at'])}: {one_line(f['result'], 120)}"
                 + (f", rolled back to {f['rolled_back_to']}" if f["rolled_back_to"] else ""))
    if u:
        line += f"; release {u['number']} is rolling out or was interrupted (`doit launch` finishes it)"
    return line
