#!/usr/bin/env python3
"""Register the dsv41-sparks provider in Pi's config directory (models.json, settings.json, extension).

Standard library only: runs with any python3 >= 3.8, without the project's virtualenv.
Usage: pi_config.py --base-url URL [--pi-version V] [--pi-bin PATH] [--extension FILE]
Environment: PI_CODING_AGENT_DIR (default ~/.pi/agent), MAX_LEN (262144), SET_DEFAULT (0), KEY_ENV
(DSV41_API_KEY). The key itself is never read: Pi resolves the reference at request time.
"""
import argparse
import datetime
import fnmatch
import json
import os
import re
import sys
import tempfile

PROVIDER = "dsv41-sparks"
MODEL = "deepseek-v4.1-flash"
DEFAULT_MAX_LEN = 262144
ENV_REFERENCE_SINCE = (0, 77, 0)  # Pi reads "$NAME" from the environment from this version on


class UserError(Exception):
    """A problem the user can fix; str() is one line (same convention as dsv41.errors)."""


# ---------------------------------------------------------------- inputs

def normalise_base_url(url):
    """'http://h:8000/v1/chat/completions/' -> 'http://h:8000/v1'; a bare host gets '/v1'."""
    raw = (url or "").strip()
    m = re.match(r"^(https?://[^/\s?#]+)(/[^\s?#]*)?$", raw)
    if not m:
        raise UserError(f"base URL {raw!r} is not an http(s) URL: pass e.g. http://HEAD:8000/v1")
    path = (m.group(2) or "").rstrip("/")
    for tail in ("/chat/completions", "/completions", "/models", "/responses", "/embeddings"):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    if not path.endswith("/v1"):
        path += "/v1"
    return m.group(1) + path


def parse_version(text):
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(x) for x in m.groups()) if m else None


def key_reference(pi_version, key_env="DSV41_API_KEY"):
    """apiKey value that makes Pi read the key from the environment at request time."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env or ""):
        raise UserError(f"KEY_ENV={key_env!r} is not an environment variable name: use e.g. DSV41_API_KEY")
    version = parse_version(pi_version)
    if version is not None and version >= ENV_REFERENCE_SINCE:
        return "$" + key_env
    return "!printenv " + key_env  # older (or unknown) Pi: a command works on every version


def settings_from_env(env):
    max_len = env.get("MAX_LEN") or str(DEFAULT_MAX_LEN)
    if not re.fullmatch(r"[1-9][0-9]*", max_len.strip()):
        raise UserError(f"MAX_LEN={max_len!r} is not a positive integer: set it to the server's --max-model-len")
    flag = (env.get("SET_DEFAULT") or "0").strip().lower()
    if flag not in ("0", "1", "false", "true", "no", "yes", ""):
        raise UserError(f"SET_DEFAULT={flag!r}: use 1 (make dsv41-sparks Pi's start-up model) or 0")
    pi_dir = env.get("PI_CODING_AGENT_DIR") or os.path.join("~", ".pi", "agent")
    full = os.path.normpath(os.path.expanduser(pi_dir))
    if not os.path.isabs(full) or full in ("/", "//", os.path.expanduser("~")):
        raise UserError(f"PI_CODING_AGENT_DIR={pi_dir!r} is not valid: give Pi's own folder as an absolute path "
                        "or one starting with ~/, e.g. ~/.pi/agent")
    return {
        "max_len": int(max_len),
        "set_default": flag in ("1", "true", "yes"),
        "key_env": env.get("KEY_ENV") or "DSV41_API_KEY",
        "pi_dir": os.path.abspath(os.path.expanduser(pi_dir)),
    }


# ---------------------------------------------------------------- lenient JSON

def _blank(text):
    """Keep newlines so positions stay the same."""
    return re.sub(r"[^\n]", " ", text)


def strip_lenient(text):
    """Replace // and /* */ comments and trailing commas with spaces; strings are left alone."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(_blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ValueError("unterminated /* comment", i)
            out.append(_blank(text[i : j + 2]))
            i = j + 2
        else:
            out.append(c)
            i += 1
    # trailing commas: a comma after a value, followed only by whitespace before } or ]
    stripped, result, i = "".join(out), [], 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|,(?=\s*[}\]])', stripped):
        k = m.start() - 1
        while k >= 0 and stripped[k] in " \t\r\n":
            k -= 1
        if m.group(0) == "," and k >= 0 and stripped[k] not in "{[,":
            result.append(stripped[i : m.start()] + " ")
            i = m.end()
    result.append(stripped[i:])
    return "".join(result)


def _position(text, offset):
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def parse_lenient(text, path):
    """JSON with comments and trailing commas -> object. UserError names file:line:column."""
    text = text.lstrip("\ufeff")
    if not text.strip():
        return {}
    try:
        data = json.loads(strip_lenient(text))
    except ValueError as err:
        offset = err.pos if isinstance(err, json.JSONDecodeError) else err.args[1]
        msg = err.msg if isinstance(err, json.JSONDecodeError) else err.args[0]
        line, col = _position(text, offset)
        raise UserError(f"{path}:{line}:{col}: malformed JSON ({msg}): fix or move the file away, then re-run")
    if not isinstance(data, dict):
        raise UserError(f"{path}:1:1: expected a JSON object at the top: fix or move the file away, then re-run")
    return data


# ---------------------------------------------------------------- JSON schema (the subset Pi's schemas use)

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


def validate(value, schema, root=None, where="$"):
    """Errors (list of 'path: problem') of value against a draft 2020-12 schema subset."""
    root = schema if root is None else root
    if schema is True or schema is None:
        return []
    if schema is False:
        return [f"{where}: not allowed"]
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return []
        target = root
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        errors = validate(value, target, root, where)
        if errors:
            return errors
    errs = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            return [f"{where}: expected {' or '.join(types)}, got {json.dumps(value)[:60]}"]
    if "const" in schema and value != schema["const"]:
        errs.append(f"{where}: must be {json.dumps(schema['const'])}")
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where}: must be one of {json.dumps(schema['enum'])}")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            ok = sum(not validate(value, sub, root, where) for sub in schema[key])
            if ok == 0 or (key == "oneOf" and ok > 1):
                errs.append(f"{where}: does not match the allowed forms ({json.dumps(value)[:60]})")
    for sub in schema.get("allOf", []):
        errs += validate(value, sub, root, where)
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errs.append(f"{where}: too short")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errs.append(f"{where}: too long")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errs.append(f"{where}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errs.append(f"{where}: above {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errs.append(f"{where}: must be > {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            errs.append(f"{where}: must be < {schema['exclusiveMaximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errs.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errs.append(f"{where}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                errs += validate(item, schema["items"], root, f"{where}[{i}]")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errs.append(f"{where}: missing {key!r}")
        props, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        for key, item in value.items():
            sub_where = f"{where}.{key}"
            matched = False
            if key in props:
                matched = True
                errs += validate(item, props[key], root, sub_where)
            for pattern, sub in patterns.items():
                if re.search(pattern, key):
                    matched = True
                    errs += validate(item, sub, root, sub_where)
            if not matched and "additionalProperties" in schema:
                errs += validate(item, schema["additionalProperties"], root, sub_where)
    return errs


def check_provider(entry):
    """Structural check of our own entry, used with or without Pi's schema."""
    errs = []
    for key in ("baseUrl", "api", "apiKey"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            errs.append(f"providers.{PROVIDER}.{key}: must be a non-empty string")
    models = entry.get("models")
    if not isinstance(models, list) or not all(isinstance(m, dict) and m.get("id") for m in models):
        errs.append(f"providers.{PROVIDER}.models: must be a list of objects with an id")
    return errs


# ---------------------------------------------------------------- the entry

def provider_entry(base_url, key_ref, max_len=DEFAULT_MAX_LEN):
    return {
        "name": "DeepSeek-V4.1-Flash (dsv41, DGX Spark)",
        "baseUrl": base_url,
        "api": "openai-completions",
        "apiKey": key_ref,
        # vLLM: system role, no store, max_tokens; thinking toggled through the chat template
        "compat": {
            "supportsDeveloperRole": False,
            "supportsStore": False,
            "supportsUsageInStreaming": True,
            "maxTokensField": "max_tokens",
            "thinkingFormat": "chat-template",
            "chatTemplateKwargs": {
                "thinking": {"$var": "thinking.enabled"},
                "reasoning_effort": {"$var": "thinking.effort", "omitWhenOff": True},
            },
        },
        "models": [
            {
                "id": MODEL,
                "name": "DeepSeek-V4.1-Flash",
                "reasoning": True,
                "input": ["text", "image"],
                "contextWindow": max_len,
                # the model knows two efforts: high and max
                "thinkingLevelMap": {
                    "minimal": "high",
                    "low": "high",
                    "medium": "high",
                    "high": "high",
                    "xhigh": "max",
                    "max": "max",
                },
            }
        ],
    }


def find_schema(pi_bin, name="models.schema.json"):
    """The schema shipped in the Pi package that `pi_bin` belongs to, or None."""
    if not pi_bin:
        return None
    d = os.path.dirname(os.path.realpath(pi_bin))
    for _ in range(6):
        candidate = os.path.join(d, "schemas", name)
        if os.path.isfile(os.path.join(d, "package.json")):
            return candidate if os.path.isfile(candidate) else None
        d = os.path.dirname(d)
    return None


# ---------------------------------------------------------------- files

def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}: fix its permissions or encoding, then re-run")


def backup(path, now):
    """Timestamped copy next to the file (the name does not end in .ts/.json, so Pi ignores it)."""
    stamp = now.strftime("%Y%m%d-%H%M%S")
    target, n = f"{path}.bak-{stamp}", 1
    while os.path.exists(target):
        n += 1
        target = f"{path}.bak-{stamp}-{n}"
    with open(path, "rb") as src:
        data = src.read()
    write_atomic(target, data, os.stat(path).st_mode & 0o7777)
    return target


def write_atomic(path, data, mode=None):
    """Temp file in the same directory, fsync, keep the mode, rename, fsync the directory."""
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=".dsv41-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def dump(data):
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def plan(pi_dir, base_url, pi_version, max_len=DEFAULT_MAX_LEN, set_default=False,
         key_env="DSV41_API_KEY", schema_path=None, extension_src=None):
    """Read and check everything; return [(path, new bytes)] for the files that must change."""
    changes = []
    key_ref = key_reference(pi_version, key_env)
    url = normalise_base_url(base_url)

    if extension_src:  # first, so the provider never appears without it
        with open(extension_src, "rb") as f:
            code = f.read()
        ext_path = os.path.join(pi_dir, "extensions", os.path.basename(extension_src))
        current = _read(ext_path)
        if current is None or current.encode("utf-8") != code:
            changes.append((ext_path, code))

    models_path = os.path.join(pi_dir, "models.json")
    text = _read(models_path)
    models = parse_lenient(text, models_path) if text is not None else {}
    providers = models.setdefault("providers", {})
    if not isinstance(providers, dict):
        raise UserError(f"{models_path}: 'providers' is not an object: fix or move the file away, then re-run")
    entry = provider_entry(url, key_ref, max_len)
    if text is None or providers.get(PROVIDER) != entry:
        providers[PROVIDER] = entry
        errs = check_provider(entry)
        if schema_path:
            try:
                with open(schema_path, encoding="utf-8") as f:
                    schema = json.load(f)
            except ValueError as err:
                raise UserError(f"{schema_path} is unreadable ({err}): reinstall Pi, then re-run")
            errs += validate(models, schema)
        if errs:
            raise UserError(f"{models_path} would not pass Pi's models schema ({'; '.join(errs[:3])}): "
                            "fix the file, then re-run")
        changes.append((models_path, dump(models)))

    settings_path = os.path.join(pi_dir, "settings.json")
    text = _read(settings_path)
    settings = parse_lenient(text, settings_path) if text is not None else {}
    before = json.loads(json.dumps(settings))
    full = f"{PROVIDER}/{MODEL}"
    enabled = settings.get("enabledModels")
    if enabled is not None:
        if not isinstance(enabled, list) or not all(isinstance(p, str) for p in enabled):
            raise UserError(f"{settings_path}: 'enabledModels' is not a list of strings: fix it, then re-run")
        if not any(p == full or p.split(":")[0] == full or fnmatch.fnmatchcase(full, p) for p in enabled):
            enabled.append(full)
    if set_default:
        settings["defaultProvider"], settings["defaultModel"] = PROVIDER, MODEL
    if settings != before:
        changes.append((settings_path, dump(settings)))

    return changes


def apply(changes, now=None):
    """Back up each existing file, then write it atomically. Returns the lines to print."""
    now = now or datetime.datetime.now()
    lines = []
    for path, data in changes:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            saved = backup(path, now)
            write_atomic(path, data)
            lines.append(f"updated {path} (backup: {saved})")
        else:
            write_atomic(path, data)
            lines.append(f"created {path}")
    return lines


def install(pi_dir, base_url, pi_version, now=None, **kw):
    return apply(plan(pi_dir, base_url, pi_version, **kw), now)


def main(argv=None, env=None):
    p = argparse.ArgumentParser(description="Register dsv41-sparks in Pi's config directory")
    p.add_argument("--base-url", required=True)
    p.add_argument("--pi-version", default="")
    p.add_argument("--pi-bin", default="", help="the pi executable, to find the package's schema")
    p.add_argument("--extension", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "dsv41-sparks.ts"))
    p.add_argument("--check", action="store_true", help="check the inputs, print the normalised base URL")
    args = p.parse_args(argv)
    try:
        cfg = settings_from_env(os.environ if env is None else env)
        if args.check:
            key_reference(args.pi_version, cfg["key_env"])
            print(normalise_base_url(args.base_url))
            return 0
        schema = find_schema(args.pi_bin)
        if schema is None:
            print("pi: no models.schema.json in the Pi package; checking the entry structurally")
        lines = install(cfg["pi_dir"], args.base_url, args.pi_version, max_len=cfg["max_len"],
                        set_default=cfg["set_default"], key_env=cfg["key_env"], schema_path=schema,
                        extension_src=args.extension)
    except UserError as err:
        print(f"dsv41: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"dsv41: {err}: check the permissions of that path, then re-run", file=sys.stderr)
        return 2
    for line in lines or [f"{cfg['pi_dir']}: already up to date"]:
        print(f"pi: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
