"""The deployment's keys on the head, read here or created once (0600): the client key (API_KEY_FILE, the
gateway's key `default`) and, behind the gateway, rank 0's own engine key ($STATE_DIR/engine_key), which only
the gateway and dsv41's head tools hold. Rank 0 gets its key as a mounted file (the client key with
GATEWAY=0); no key is ever in a unit file, an argument list or a log."""
import secrets

from dsv41.client.api import read_key_file
from dsv41.head.core import statefiles


def read_key(cfg):
    """The client key (None when there is none yet)."""
    return read_key_file(cfg.api_key_file)


def write_key(cfg, key):
    """API_KEY_FILE replaced by key, atomically (0600): `doit keys rotate default`."""
    statefiles.write_file(cfg.api_key_file, key + "\n", 0o600)


def read_or_create_key(cfg):
    return _read_or_create(cfg.api_key_file, "the API key")


def engine_key_file(cfg):
    """Where rank 0's key is kept on the head: its own file behind the gateway, else the client key's."""
    return cfg.layout.engine_key_file


def engine_key(cfg, create=False):
    """The key rank 0 serves with (None when there is none yet and not create)."""
    path = engine_key_file(cfg)
    return _read_or_create(path, "rank 0's engine key") if create else read_key_file(path)


def group_key(cfg, index, create=False):
    """The key serving group `index` serves with: group 0's is the engine key (engine_key); another group's
    rank 0 its own ($STATE_DIR/engine_key.g<N> on the head, sent by that group's side door only). None when
    there is none yet and not create."""
    if index == 0:
        return engine_key(cfg, create)
    path = f"{engine_key_file(cfg)}.g{index}"
    return _read_or_create(path, f"group {index}'s engine key") if create else read_key_file(path)


def _read_or_create(path, what):
    key = read_key_file(path)
    if key:
        return key
    key = secrets.token_urlsafe(32)
    statefiles.write_file(path, key + "\n", 0o600)
    print(f"[head] created {what} in {path} (mode 0600)")
    return key
