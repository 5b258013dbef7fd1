"""Alertmanager's API v2 on the head (dsv41-alertmanager, 127.0.0.1 only), its delivery counters, and
which receivers the settings give. Every call has a short timeout and raises AmError only; callers turn
that into a line (core/silences.py, head/alerts.py)."""
import re
from datetime import datetime, timezone

import requests

TIMEOUT = (1.0, 4.0)                    # connect, read: a command is never held up for long
# its delivery counters per integration: notifications (counted when one starts; failed when it gave up)
# and requests (each attempt, counted when it ended; failed when that attempt did)
COUNTER_RE = re.compile(r'^alertmanager_(notifications|notification_requests)(_failed)?_total\{[^}]*integration="([a-z]+)"[^}]*\} (\S+)$')


class AmError(Exception):
    """Alertmanager did not answer, or answered something unexpected."""


def url(cfg):
    return f"http://127.0.0.1:{cfg.alertmanager_port}"


def receivers(cfg):
    """The integrations the settings give: "webhook", "email" (none: alerts go nowhere)."""
    return [k for k, on in (("webhook", cfg.alert_webhook_url), ("email", cfg.alert_email_to)) if on]


def absent(cfg, err):
    return f"no answer from Alertmanager at {url(cfg)} ({err}): `doit monitoring --install` runs it"



def iso(t):
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ts(text):
    """Unix time from the API's RFC 3339 (nanoseconds, Z)."""
    text = re.sub(r"\.(\d{1,6})\d*", lambda m: "." + m.group(1).ljust(6, "0"), text).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def counters(text):
    """{(integration, name): value} from Alertmanager's /metrics; name is "notifications",
    "notifications_failed", "notification_requests" or "notification_requests_failed"."""
    out = {}
    for line in text.splitlines():
        m = COUNTER_RE.match(line)
        if m:
            key = (m.group(3), m.group(1) + (m.group(2) or ""))
            out[key] = out.get(key, 0) + float(m.group(4))
    return out


# ---- the API ------------------------------------------------------------------------------------

def call(method, url, json=None):
    try:
        r = requests.request(method, url, json=json, timeout=TIMEOUT)
        r.raise_for_status()
        return r.json() if r.content and "json" in r.headers.get("Content-Type", "") else r.text
    except (requests.RequestException, ValueError) as err:
        raise AmError(" ".join(str(err).split())[:200]) from None


def silences(base):
    return call("GET", f"{base}/api/v2/silences")


def post_silence(base, body):
    return call("POST", f"{base}/api/v2/silences", body)["silenceID"]


def expire(base, silence_id):
    call("DELETE", f"{base}/api/v2/silence/{silence_id}")


def alerts(base):
    return call("GET", f"{base}/api/v2/alerts")


def post_alerts(base, items):
    call("POST", f"{base}/api/v2/alerts", items)


def metrics(base):
    return counters(call("GET", f"{base}/metrics"))
