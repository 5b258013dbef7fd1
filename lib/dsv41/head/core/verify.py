"""doit verify: reassemble and verify the checkpoint on the machine running doit (dsv41.node.checkpoint
does the work, shown with the head's progress bar); the receipt tells later runs what is already verified."""
from dsv41 import names
from dsv41.head.core import progress
from dsv41.node import checkpoint as ck


def gb(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def checkpoint(cfg):
    return ck.Checkpoint(cfg.model_dir, names.state_path(cfg.state_dir, names.RECEIPT), cfg.keep_parts,
                         cfg.plan_name, progress=progress.bar)


def verify(cfg):
    """Verify the checkpoint here; returns the receipt."""
    return checkpoint(cfg).verify()


def is_fresh(cfg):
    """doit uptodate: the receipt matches a stat of the files (no hashing)."""
    return checkpoint(cfg).check()[0]
