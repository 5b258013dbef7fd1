"""doit alerts [test]: what the head's Alertmanager (doit monitoring --install) fires and silences, and a
test alert through it with its delivery per integration (the silences planned work sets: core/silences.py)."""
import sys
import time

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import alertmanager as am
from dsv41.head.core.silences import clock

NOT_DELIVERED = 3                       # doit alerts test: an integration did not deliver (docs/operating.md)
TEST_ALERT = "DSV41Test"                # alertmanager.yml routes it alone, at once
TEST_WAIT_S = 40                        # Alertmanager gives up a delivery after 10 s; then a retry's margin


# ---- doit alerts [test] ------------------------------------------------------------------------

def alerts(cfg, words=()):
    try:
        if list(words) == ["test"]:
            return test(cfg)
        if words:
            raise UserError(f"`doit alerts {' '.join(words)}`: expected `doit alerts` (what fires and what is "
                            "silenced) or `doit alerts test` (a test alert through every receiver)")
        return listing(cfg)
    except UserError as err:
        print(f"dsv41: alerts: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None


def listing(cfg):
    try:
        firing, sils = am.alerts(am.url(cfg)), am.silences(am.url(cfg))
    except am.AmError as err:
        raise UserError(am.absent(cfg, err)) from None
    print(f"Alertmanager {am.url(cfg)}: " + (f"{len(firing)} alert(s)" if firing else "no alert fires"))
    for a in sorted(firing, key=lambda a: a["startsAt"]):
        lab, st = a["labels"], a["status"]
        why = ("silenced" if st.get("silencedBy") else "inhibited" if st.get("inhibitedBy") else "notified")
        print(f"  {lab.get('alertname', '?'):<26} {lab.get('severity', '-'):<9} {lab.get('node', '-'):<9} "
              f"since {clock(am.ts(a['startsAt']))}  {why}: {a.get('annotations', {}).get('summary', '')}")
    active = [s for s in sils if s["status"]["state"] != "expired"]
    for s in active:
        ms = ",".join(f"{m['name']}{'=~' if m['isRegex'] else '='}{m['value']}" for m in s["matchers"])
        print(f"  silence {s['id'][:8]} {ms} by {s['createdBy']}, {clock(am.ts(s['startsAt']))} to "
              f"{clock(am.ts(s['endsAt']))}: {s.get('comment', '')}")
    if not active:
        print("  no silence")


def verdicts(before, after, integrations):
    """{integration: "delivered" | "not delivered" | None (still trying)} from two snapshots of
    Alertmanager's counters: an attempt that ended well is delivered, a notification it gave up on is not."""
    def delta(i, name):
        return after.get((i, name), 0) - before.get((i, name), 0)
    out = {}
    for i in integrations:
        ok = delta(i, "notification_requests") - delta(i, "notification_requests_failed")
        out[i] = "delivered" if ok > 0 else "not delivered" if delta(i, "notifications_failed") else None
    return out


def test(cfg, wait_s=TEST_WAIT_S):
    """A test alert POSTed to Alertmanager (labelled with the cluster), then resolved; per integration,
    whether Alertmanager delivered it, from its own counters before and after. Exit 3 when one did not."""
    wanted = am.receivers(cfg)
    if not wanted:
        raise UserError("no alert receiver is set: set ALERT_WEBHOOK_URL or ALERT_EMAIL_TO, then "
                        "`doit monitoring --install`")
    base = am.url(cfg)
    now = time.time()
    alert = {"labels": {"alertname": TEST_ALERT, "cluster": cfg.cluster_name, "severity": "test",
                        "sent": am.iso(now)},
             "annotations": {"summary": f"a test alert of cluster {cfg.cluster_name} from `doit alerts test`",
                             "description": "Nothing is wrong: this checks that alerts reach a person."},
             "startsAt": am.iso(now)}
    try:
        before = am.metrics(base)
        am.post_alerts(base, [alert])
        seen = verdicts(before, before, wanted)
        deadline = time.monotonic() + wait_s
        while None in seen.values() and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = verdicts(before, am.metrics(base), wanted)
        am.post_alerts(base, [{**alert, "endsAt": am.iso(time.time())}])
    except am.AmError as err:
        print(f"not delivered: {am.absent(cfg, err)}")
        raise SystemExit(NOT_DELIVERED) from None
    print(f"a test alert went through Alertmanager at {base} (and was resolved):")
    for i, v in seen.items():
        print(f"  {i:<8} " + (v if v else f"not delivered: no attempt within {wait_s} s")
              + ("" if v == "delivered" else f" (journalctl -u {names.ALERTMANAGER_UNIT} says why)"))
    if any(v != "delivered" for v in seen.values()):
        raise SystemExit(NOT_DELIVERED)
