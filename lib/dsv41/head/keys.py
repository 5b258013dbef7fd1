"""doit keys [list | add NAME | revoke NAME]: the gateway's named client keys (GATEWAY=1).

`add` prints a new key once and keeps only its sha256 (the gateway's key map on the head, mode 0600);
`revoke` writes the map first, then tells the running gateway (its runtime API): refused within a second,
nothing restarts, and a crash between the two cannot bring the key back. `list` shows each name, when it
was added, when it was last used and its requests, errors, 503s and 429s since the gateway started. The
client key of API_KEY_FILE is the key `default` (Pi's). The map is never part of a release: a rollback
never brings back a revoked key."""
import re
import secrets
import time

from dsv41.errors import BadInput, UserError
from dsv41.head.core.cluster import Cluster, read_key

USAGE = "expected `doit keys`, `doit keys add NAME` or `doit keys revoke NAME`"
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


def keys(cfg, words=()):
    words = list(words)
    if words not in ([], ["list"]) and not (len(words) == 2 and words[0] in ("add", "revoke")):
        raise BadInput(f"`doit keys {' '.join(words)}`: {USAGE}")
    verb = words[0] if words else "list"
    if len(words) == 2 and not NAME_RE.match(words[1]):
        raise BadInput(f"key name {words[1]!r}: expected 1 to 40 letters, digits, `.`, `_` or `-`")
    if not cfg.gateway:
        raise UserError("GATEWAY=0: rank 0 serves PORT with the one key of API_KEY_FILE; named keys need the "
                        "gateway (GATEWAY=1, then `doit launch`)")
    default = read_key(cfg)
    if not default:
        raise UserError(f"no client key yet in {cfg.api_key_file}: run `doit launch` first")
    cl = Cluster(cfg)
    cl.connect()
    gw = cl.gateway
    gw.ensure(gw.key_hash(default))
    if verb == "add":
        key = secrets.token_urlsafe(32)
        out = gw.keys(add={"name": words[1], "hash": gw.key_hash(key)})
        print(f"key {words[1]} (shown once, only its hash is kept; `doit keys revoke {words[1]}` ends it):")
        print(key)
        print(running_line(out))
        return
    if verb == "revoke":
        out = gw.keys(revoke=words[1])
        print(f"revoked {words[1]}: " + ("the gateway refuses it from now on" if out["running"] else
                                          "removed from the key map (the gateway is not running)"))
        return
    print("\n".join(list_lines(gw.keys())))


def running_line(out):
    return "the gateway takes it from now on" if out["running"] else (
        "in the key map: the gateway takes it once it runs (`doit launch`)")


def _ago(s):
    return "-" if s is None else f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else (
        f"{s / 3600:.0f} h ago")


def list_lines(out, now=None):
    now = time.time() if now is None else now
    lines = [f"  {'name':<20} {'added (UTC)':<20} {'last used':<12} {'requests':>8} {'errors':>6} {'503':>5} {'429':>5}"]
    for k in out["keys"]:
        added = time.strftime("%Y-%m-%d %H:%M", time.gmtime(k["added"])) if k.get("added") else "-"
        lines.append(f"  {k['name']:<20} {added:<20} {_ago(k.get('idle_s')):<12} {k.get('requests', 0):>8} "
                     f"{k.get('errors', 0):>6} {k.get('unavailable', 0):>5} {k.get('limited', 0):>5}")
    if not out["running"]:
        lines.append("(the gateway is not running: no use to show)")
    else:
        lines.append("(use since the gateway last started)")
    return lines
