"""A checkpoint's layout on disk: the sha256 manifest, the files it lists and the others, the `.partNN`
pieces a split shard is downloaded in, the EXL3 plan and its bank dirs, and the interrupted transfers
rsync left in its partial dirs. Reads only; checkpoint.py verifies and reassembles.
"""
import json
import os
import re

from dsv41.errors import UserError, one_line

MANIFEST = "sha256-manifest.txt"
REQUIRED = ("config.json", "model.safetensors.index.json")
PART_RE = re.compile(r"^(?P<base>.+)\.part(?P<n>\d{2,})$")
TMP_SUFFIX = ".dsv41-tmp"
PARTIAL_DIR = ".dsv41-partial"          # rsync's partial dir on receiving nodes


def read_manifest(model_dir):
    path = os.path.join(model_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UserError(f"{path} is missing: run `doit download` (or copy the model here)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path} cannot be read: {err}") from None
    entries = {}
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"^([0-9a-fA-F]{64}) [ *](.+)$", line)
        rel = m and os.path.normpath(m.group(2))
        if not m or rel.startswith(("/", "..")) or rel == ".":
            raise UserError(f"{path} line {i} is not `<sha256>  <relative path>`: {one_line(line, 120)}")
        if PART_RE.match(os.path.basename(rel)):
            continue        # a .partNN line: its shard's own hash covers the joined parts, which go after
        entries[rel] = m.group(1).lower()
    if not entries:
        raise UserError(f"{path} lists no files: download it again")
    return entries


def _skip_name(name):
    return name.startswith(".") or name.endswith(TMP_SUFFIX)


def listing(model_dir):
    """{relative path: (size, mtime_ns)} of the checkpoint's files: no part files, no hidden files or
    dirs (.cache/, rsync partials), no temporary files."""
    out = {}
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if _skip_name(name) or PART_RE.match(name):
                continue
            p = os.path.join(root, name)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            out[os.path.relpath(p, model_dir)] = (st.st_size, st.st_mtime_ns)
    return out


def find_parts(model_dir, names):
    """{base relative path: [(n, relative part path), ...] sorted} for the part files next to `names`."""
    groups = {}
    for d in sorted({os.path.dirname(n) for n in names}):
        try:
            entries = os.listdir(os.path.join(model_dir, d))
        except FileNotFoundError:
            continue
        for name in entries:
            m = PART_RE.match(name)
            if m and not name.startswith("."):
                base = os.path.join(d, m.group("base"))
                groups.setdefault(base, []).append((int(m.group("n")), os.path.join(d, name)))
    return {b: sorted(p) for b, p in groups.items()}


def part_gap(parts):
    """A message if the numbering starts late or has a gap, else None."""
    nums = [n for n, _ in parts]
    if nums[0] > 1:
        return f"part {0:02d} is missing (the first present is {nums[0]:02d})"
    for a, b in zip(nums, nums[1:]):
        if b != a + 1:
            missing = ", ".join(f"{n:02d}" for n in range(a + 1, b))
            return f"part {missing} is missing (found {nums[0]:02d}-{nums[-1]:02d})"
    return None


def plan_banks(model_dir, plan):
    """Bank dirs (relative to model_dir) named by the plan's `qdir`, after checking the plan exists."""
    path = os.path.join(model_dir, "exl3", "plan", plan)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UserError(f"plan file {path} is missing: check PLAN_NAME or download the model again") from None
    except (OSError, ValueError) as err:
        raise UserError(f"plan file {path} is not valid JSON: {one_line(err, 120)}") from None
    qdir = data.get("qdir") if isinstance(data, dict) else None
    if not isinstance(qdir, str) or not qdir.strip(":"):
        raise UserError(f"plan file {path} has no `qdir` (colon-separated bank dirs under exl3/)")
    return [os.path.join("exl3", os.path.normpath(q)) for q in qdir.split(":") if q]


def count_bank_files(model_dir, banks):
    total = 0
    for bank in banks:
        d = os.path.join(model_dir, bank)
        if not os.path.isdir(d):
            raise UserError(f"EXL3 bank dir {d} is missing: download or copy the model again")
        n = sum(1 for name in os.listdir(d)
                if not _skip_name(name) and os.path.isfile(os.path.join(d, name)))
        if not n:
            raise UserError(f"EXL3 bank dir {d} is empty: download or copy the model again")
        total += n
    return total


def subdirs(d):
    """The dirs in d but hidden ones; none when d is missing."""
    try:
        return [n for n in os.listdir(d) if os.path.isdir(os.path.join(d, n)) and not n.startswith(".")]
    except FileNotFoundError:
        return []


def partial_transfers(model_dir):
    """Interrupted rsync transfers: {relative path of the target: (size, mtime_ns)}."""
    out = {}
    for root, dirs, files in os.walk(model_dir):
        if os.path.basename(root) == PARTIAL_DIR:
            for name in files:
                st = os.stat(os.path.join(root, name))
                out[os.path.relpath(os.path.join(os.path.dirname(root), name), model_dir)] = (
                    st.st_size, st.st_mtime_ns)
            dirs[:] = []
        else:
            dirs[:] = [d for d in dirs if d == PARTIAL_DIR or not d.startswith(".")]
    return out
