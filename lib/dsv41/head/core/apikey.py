"""The deployment's API key on the head: read it, or create it once (0600). Rank 0 gets it as a mounted
file; the clients send it; it is never in a unit file, an argument list or a log."""
import secrets

from dsv41.client.api import read_key_file
from dsv41.head.core import statefiles


def read_key(cfg):
    return read_key_file(cfg.api_key_file)


def read_or_create_key(cfg):
    key = read_key(cfg)
    if key:
        return key
    key = secrets.token_urlsafe(32)
    statefiles.write_file(cfg.api_key_file, key + "\n", 0o600)
    print(f"[head] created the API key in {cfg.api_key_file} (mode 0600)")
    return key
