"""doit keys [list | add NAME | revoke NAME | rotate NAME]: the gateway's named client keys (GATEWAY=1).

`add` prints a new key once, then keeps only its sha256 (the gateway's key map on the head, mode 0600): a key
that could not be shown is never stored. `revoke` and `rotate` change the map, then tell the running gateway
(its runtime API): refused within a second, nothing restarts. Every change is made under the keys' own lock
(never the run lock: keys change during a launch or a recovery) and the gateway's answer is checked: when it
did not take a change the command says so in one line and exits non-zero; the map stays the truth, and the
gateway's next reload applies it. `list` shows each name, when it was added, when it was last used and its
requests, errors, 503s and 429s since the gateway started. The client key of API_KEY_FILE is the key
`default` (Pi's, smoke's, bench's): it is never revoked, only rotated (API_KEY_FILE and the map together).
The map is never part of a release: a rollback never brings back a revoked key."""
import os
import secrets
import sys
import time

from dsv41.errors import BadInput, UserError, one_line
from dsv41.head.core.cluster import Cluster, Gateway, read_key, write_key

DEFAULT, NAME_RE, OLD_NAME_RE = Gateway.DEFAULT_KEY, Gateway.NAME_RE, Gateway.OLD_NAME_RE

USAGE = ("expected `doit keys`, `doit keys add NAME`, `doit keys revoke NAME` or `doit keys rotate NAME` (NAME "
         "default: API_KEY_FILE's key)")


def keys(cfg, words=()):
    verb, name = parse(words)
    if not cfg.layout.door:
        raise UserError("GATEWAY=0: rank 0 serves PORT with the one key of API_KEY_FILE; named keys need the "
                        "gateway (GATEWAY=1, then `doit launch`)")
    default = read_key(cfg)
    if not default:
        raise UserError(f"no client key yet in {cfg.api_key_file}: run `doit launch` first")
    cl = Cluster(cfg)
    cl.connect()
    gw = cl.gateway
    gw.ensure(gw.key_hash(default))
    if verb == "list":
        print("\n".join(list_lines(gw.keys())))
    elif verb == "revoke":
        out = gw.keys(revoke=name)
        print(f"revoked {name}: " + ("the gateway refuses it from now on" if out["running"] else
                                     "removed from the key map (the gateway is not running)"))
    elif verb == "rotate" and name.lower() == DEFAULT:
        key = secrets.token_urlsafe(32)
        write_key(cfg, key)                     # the file is the truth for `default`: ensure follows it
        gw.ensure(gw.key_hash(key))
        show(f"rotated default: {cfg.api_key_file} holds the new key, the old one is refused from now on; Pi's "
             "shell needs:", f"export DSV41_API_KEY={key}")
    else:
        known = any(k["name"].lower() == name.lower() for k in gw.keys()["keys"])
        if verb == "add" and known:
            raise UserError(f"a key named {name} exists (names are unique without regard to case): `doit keys "
                            f"rotate {name}` replaces it, `doit keys revoke {name}` ends it")
        if verb == "rotate" and not known:
            raise UserError(f"no key is named {name}: `doit keys list` shows them, `doit keys add {name}` makes one")
        key = secrets.token_urlsafe(32)
        show(f"key {name} (shown once, only its hash is kept; `doit keys revoke {name}` ends it):", key)
        try:
            out = gw.keys(**{verb: {"name": name, "hash": gw.key_hash(key)}})
        except UserError as err:
            raise UserError(f"{err} (the key above is not in force until then)") from None
        print(running_line(out) + ("" if verb == "add" else "; the old key is refused"))


def parse(words):
    """(verb, name) of `doit keys` words; BadInput naming what is wrong."""
    words = list(words)
    if words in ([], ["list"]):
        return "list", None
    if len(words) != 2 or words[0] not in ("add", "revoke", "rotate"):
        raise BadInput(f"`doit keys {' '.join(words)}`: {USAGE}")
    verb, name = words
    if verb == "add" and not NAME_RE.fullmatch(name):
        raise BadInput(f"key name {name!r}: expected 1 to 64 letters, digits, `.`, `_` or `-`, starting with a "
                       "letter or a digit")
    if verb != "add" and not OLD_NAME_RE.fullmatch(name):
        raise BadInput(f"key name {name!r}: no key has such a name (`doit keys list` shows them)")
    if verb == "revoke" and name.lower() == DEFAULT:
        raise BadInput("the key `default` is API_KEY_FILE's (Pi, smoke, bench) and is never revoked: "
                       "`doit keys rotate default` replaces it and refuses the old one")
    return verb, name


def show(*lines):
    """Print lines that must reach the user before anything is stored (a new key): UserError, nothing
    stored, when they cannot be written (`> /dev/full`); a closed pipe ends quietly there too."""
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except OSError as err:
        try:                                    # what is still buffered must not fail the exit again
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, sys.__stdout__.fileno())
        except OSError:
            pass
        raise UserError(f"the new key could not be shown ({one_line(err, 100)}): nothing was changed") from None


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
