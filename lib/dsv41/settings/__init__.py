"""The settings: what each is (kinds), dsv41's own table (schema; the engine declares its own), loading
them in layers (layers), the Config they make (config), the copy a later service runs on (resolved)
and the checkout's paths (paths). The `doit config` verb (head/config.py) only displays them."""
