"""How a setting's value is checked: one validator per kind (settings/setting.py says what a setting
is). A bad value is one ConfigError line naming the variable (or the profile file and key), the value
and what is accepted. The tables of settings are elsewhere: dsv41's own in settings/schema.py, an
engine's in its package (dsv41/vllm/settings.py)."""
import difflib
import ipaddress
import os
import re
import shlex

from dsv41.errors import BadInput, UserError
from dsv41.node import memguard
from dsv41.settings.setting import number

MAX_VALUE_LEN = 4096          # any setting's value; an ssh target is at most 255 characters
MAX_TARGET_LEN = 255
# flags and variables that would put a secret into a unit file or an argument list (an engine's own
# secret variables are declared with its settings: SECRET_ENV there)
SECRET_FLAGS = ("--api-key", "--hf-token")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "DSV41_API_KEY")
DIGEST_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*@sha256:[0-9a-f]{64}$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*(@sha256:[0-9a-f]{64})?$")
URL_RE = re.compile(r"^https?://[^\s/]+\S*$")
# user@host; neither may start with "-", so nothing that reaches ssh or rsync can become an option
TARGET_RE = re.compile(r"^(?:[a-z_][a-z0-9_.-]*@)?(?:[A-Za-z0-9.][A-Za-z0-9.-]*|\[[0-9a-fA-F:]+\])$")


class ConfigError(BadInput):
    pass


def nearest(word, known):
    """' (did you mean X?)' for the closest known name, or ''."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# ---- one validator per kind: (setting, label, value as a string) -> the parsed value ------------

def bad(label, value, accepted):
    sep = " = " if ".toml" in label else "="
    shown = value if len(str(value)) <= 80 else str(value)[:60] + f"... ({len(str(value))} characters)"
    return ConfigError(f"{label}{sep}{shown!r} is not valid: expected {accepted}")


def _range(s):
    return f" from {number(s.lo)} to {number(s.hi)}" if s.hi is not None else f" of at least {number(s.lo)}"


# numbers in ASCII digits: int() and float() also take any Unicode digit (١٢) and a stray underscore (1_)
INT_RE = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")
FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _int(s, label, v):
    if not INT_RE.fullmatch(v.strip()):
        raise bad(label, v, f"a whole number{_range(s)}")
    n = int(v.strip().replace("_", ""))
    if n < s.lo or (s.hi is not None and n > s.hi):
        raise bad(label, v, f"a whole number{_range(s)}")
    return n


def _float(s, label, v):              # more than lo (a utilisation of 0 is none), at most hi
    x = float(v.strip()) if FLOAT_RE.fullmatch(v.strip()) else float("nan")
    if not s.lo < x <= s.hi:
        raise bad(label, v, f"a number more than {s.lo:g} and at most {s.hi:g}")
    return x


def _floor(s, label, v):              # the memory guard's own rule, so both accept the same floors
    try:
        return memguard.check_floor(v, label)
    except UserError as err:
        raise ConfigError(str(err)) from None


def _bool(s, label, v):
    low = v.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise bad(label, v, "1 or 0 (true/false)")


def _choice(s, label, v):
    if v.strip() not in s.choices:
        raise bad(label, v, "one of " + ", ".join(s.choices))
    return v.strip()


def _text(s, label, v):
    """Empty only where the default is: an empty model name or memlock value means nothing."""
    v = v.strip()
    if (v or s.default != "") and not re.match(s.pattern, v):
        raise bad(label, v, s.expect)
    return v


def _secret(s, label, v):
    return v


def _webhook(s, label, v):
    v = v.strip()
    if v and not URL_RE.match(v):
        raise bad(label, "(hidden)", "an http:// or https:// URL")
    return v


def _url(s, label, v):
    v = v.strip()
    if v and not URL_RE.match(v):
        raise bad(label, v, "an http:// or https:// URL")
    return v


def _path(s, label, v):
    """An absolute path or one starting with ~/ (as configured: each node resolves ~ against its home);
    empty when the setting may be empty. Never / or the home directory itself: what dsv41 keeps there
    would be scattered among everything else."""
    v = v.strip()
    if not v and s.default == "":
        return ""
    if not v or "\n" in v or "\0" in v or not (v.startswith("/") or v == "~" or v.startswith("~/")):
        raise bad(label, v, "an absolute path or one starting with ~/ (spaces and quotes are fine)")
    if {_folder(v[1:] if v[0] == "~" else v), _folder(os.path.expanduser(v))} & {"/", _folder("~")}:
        raise bad(label, v, "a folder of its own below / or ~, not / or the home directory itself, e.g. ~/dsv41")
    return v.rstrip("/")


def _folder(path):
    """The folder a path names, ~ expanded and every `//`, `.` and `..` resolved (no symlink followed)."""
    return "/" + os.path.normpath(os.path.expanduser(path) or "/").lstrip("/")


def _words(s, label, v):
    try:
        words = tuple(shlex.split(v))
    except ValueError as err:
        raise bad(label, v, f"shell words with balanced quotes ({err})") from None
    for w in words:
        if w.split("=", 1)[0] in SECRET_FLAGS:
            raise ConfigError(f"{label} carries {w.split('=', 1)[0]}: a secret never goes into a unit file or an "
                              "argument list; rank 0 reads the API key from API_KEY_FILE ($STATE_DIR/api_key), "
                              "HF_TOKEN is read from the environment")
    return words


# ssh's options (OpenSSH's getopt string): those that take a value, and those that do not
SSH_VALUE_OPTS, SSH_FLAGS = "BDEFIJLOPQRSWbceilmopw", "1246AaCfGgKkMNnqsTtVvXxYy"


def _sshopts(s, label, v):
    """ssh options as shell words: each word an option (or the value of the one before it). Any other
    word would be taken by ssh as its destination, sending every command to another host."""
    words, expects_value = _words(s, label, v), False
    for w in words:
        if expects_value:
            expects_value = False
            continue
        if not re.fullmatch(r"-[A-Za-z0-9].*", w, re.S):
            raise bad(label, v, f"ssh options, each word an option or the value of the one before ({w!r} would "
                      "be ssh's destination), e.g. -p 2222 -o StrictHostKeyChecking=accept-new")
        for i, c in enumerate(w[1:], 1):
            if c in SSH_VALUE_OPTS:
                expects_value = i == len(w) - 1         # -p 2222, or its value in the same word: -p2222
                break
            if c not in SSH_FLAGS:
                raise bad(label, v, f"ssh options ({w!r}: ssh has no option -{c}), e.g. -p 2222 -o "
                          "StrictHostKeyChecking=accept-new")
    if expects_value:
        raise bad(label, v, f"ssh options, each with its value ({words[-1]} has none), e.g. -p 2222")
    return words


def _hostport(s, label, v):
    v = v.strip()
    m = re.fullmatch(r"(?:[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\]):([0-9]{1,5})", v)
    if v and not (m and s.lo <= int(m.group(1)) <= s.hi):
        raise bad(label, v, f"host:port with a port{_range(s)}, e.g. mail.example.org:587")
    return v


def _command(s, label, v):            # a program and its arguments: words, the first not an option
    words = _words(s, label, v)
    if not words or words[0].startswith("-"):
        raise bad(label, v, s.expect)
    return words


def _target(s, label, v):
    v = v.strip()
    if not v:
        return ""
    if len(v) > MAX_TARGET_LEN:
        raise bad(label, v, f"an ssh target of at most {MAX_TARGET_LEN} characters, like user@10.10.10.11")
    if v.startswith("-") or "@-" in v:
        raise bad(label, v, "an ssh target whose user and host do not start with '-' "
                  "(it would reach ssh as an option), like user@10.10.10.11")
    if not TARGET_RE.match(v):
        raise bad(label, v, "an ssh target like user@10.10.10.11 (the worker's fabric address)")
    return v


def _targets(s, label, v):
    v = v.strip()
    if not v:
        return ()
    items = [w.strip() for w in v.split(",")]
    if any(not t for t in items):
        raise bad(label, v, "a comma list of ssh targets, user@a,user@b")
    items = [_target(s, label, t) for t in items]
    if len(set(items)) != len(items):
        raise bad(label, ",".join(items), "distinct ssh targets, one per worker")
    return tuple(items)


def _list(s, label, v):
    items = tuple(x.strip() for x in v.split(",") if x.strip())
    for x in items:
        if x not in s.choices:
            raise ConfigError(f"{label}: unknown name {x!r}{nearest(x, s.choices)}: expected names from "
                              + ", ".join(s.choices))
    return items


def _caps(s, label, v):
    if not v.strip():
        return ()
    items = [x.strip() for x in v.split(",") if x.strip()]
    sizes = sorted({int(x) for x in items}) if all(re.fullmatch(r"[0-9]+", x) for x in items) else []
    if not sizes or sizes[0] < s.lo or sizes[-1] > s.hi:
        raise bad(label, v, f"a comma list of whole numbers{_range(s)}, e.g. 1,2,4,8")
    return tuple(sizes)


def _gpus(s, label, v):
    """all, none (empty) or device numbers, written as docker run --gpus takes a device list."""
    v = v.strip()
    if v in ("", "all"):
        return v
    items = v.strip('"').removeprefix("device=").split(",")
    if not all(re.fullmatch(r"[0-9]{1,3}", x.strip()) and int(x) <= s.hi for x in items):
        raise bad(label, v, f"all, empty (no GPU) or device numbers{_range(s)} as a comma list, e.g. 0 or 0,1")
    ids = ",".join(str(n) for n in sorted({int(x) for x in items}))
    return f'"device={ids}"' if "," in ids else f"device={ids}"


def _image(s, label, v):
    return v.strip()                  # pinned or not is decided with ALLOW_UNPINNED_IMAGE (layers.py)


def _ip(s, label, v):
    try:
        return str(ipaddress.IPv4Address(v.strip()))
    except ValueError:
        raise bad(label, v, "an IPv4 address on the fabric network, e.g. 10.10.10.13") from None


def _ifname(s, label, v):
    if not re.match(r"^[A-Za-z0-9_.:-]{1,15}$", v.strip()):
        raise bad(label, v, "a network interface name as shown by `ip -br a`")
    return v.strip()


def _hcas(s, label, v):
    items = tuple(x.strip() for x in v.split(",") if x.strip())
    if not items or not all(re.match(r"^[A-Za-z0-9_.-]+(?::[0-9]+)?$", x) for x in items):
        raise bad(label, v, "a comma list of RDMA devices as shown by `rdma link`, e.g. rocep1s0f1")
    return items


KINDS = {"int": _int, "float": _float, "floor": _floor, "bool": _bool, "choice": _choice, "text": _text,
         "secret": _secret, "webhook": _webhook, "url": _url, "path": _path, "words": _words, "sshopts": _sshopts,
         "command": _command, "hostport": _hostport, "target": _target, "targets": _targets, "list": _list,
         "caps": _caps, "gpus": _gpus, "image": _image, "ip": _ip, "ifname": _ifname, "hcas": _hcas}
# the Python type of each kind's parsed value (settings/config.py types the Config's fields with them)
PY_TYPES = {"int": int, "float": float, "floor": float, "bool": bool, "words": tuple, "sshopts": tuple, "command": tuple,
            "targets": tuple, "list": tuple, "caps": tuple, "hcas": tuple}
PY_TYPES.update({k: str for k in KINDS if k not in PY_TYPES})
# what a profile writes for each kind (TOML types); every other kind is a string
HIDDEN_KINDS = ("secret", "webhook")     # `doit config` shows these as set or unset
TOML_TYPES = {"int": (int,), "float": (int, float), "floor": (int, float), "bool": (bool,)}
TOML_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}


def parse(s, label, value):
    """The value of one setting (a string from the environment, or a profile's TOML value already
    checked by toml_type), checked by its kind's validator."""
    text = value if isinstance(value, str) else ("1" if value is True else "0" if value is False else str(value))
    if len(text) > MAX_VALUE_LEN:
        raise bad(label, text, f"at most {MAX_VALUE_LEN} characters")
    if "\0" in text:
        raise bad(label, text, "text without NUL characters")
    return KINDS[s.kind](s, label, text)


def toml_type(s, label, value):
    """A profile's value must have the TOML type of its kind: `worker = 5` is refused, not read as "5"."""
    types = TOML_TYPES.get(s.kind, (str,))
    if not isinstance(value, types) or (isinstance(value, int) and isinstance(value, bool) and bool not in types):
        raise ConfigError(f"{label} = {value!r} is not valid: expected {TOML_WORDS[types[-1]]}"
                          + (f" ({s.help})" if s.help else ""))
    return value
