"""pi/pi_config.py: the JSON editing behind pi/install.sh."""
import datetime
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pi"))
import pi_config  # noqa: E402
from pi_config import UserError  # noqa: E402

FULL = "dsv41-sparks/deepseek-v4.1-flash"
URL = "http://10.0.0.1:8000/v1"
REAL_SCHEMA = Path("/var/cache/dsv41-tests/pi/pi/node_modules/@earendil-works/pi-coding-agent/schemas/models.schema.json")

MODELS = """{
  // hand-written: a local server
  "providers": {
    /* keep me */
    "ollama": {
      "baseUrl": "http://localhost:11434/v1", // URL with // inside a string
      "api": "openai-completions",
      "apiKey": "ollama",
      "headers": {"X-Note": "a /* not a comment */ b", "X-Quote": "say \\"hi\\" // still a string"},
      "models": [{"id": "qwen2.5-coder:7b",},],
    },
  },
}
"""


def listing(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in Path(d).rglob("*") if p.is_file()}


def install(pi_dir, **kw):
    kw.setdefault("now", datetime.datetime(2026, 11, 30, 12, 0, 0))
    return pi_config.install(str(pi_dir), kw.pop("url", URL), kw.pop("version", "1.6.0"), **kw)


@pytest.fixture
def pi_dir(tmp_path):
    d = tmp_path / "agent"
    d.mkdir()
    (d / "models.json").write_text(MODELS)
    return d


# ---------------------------------------------------------------- inputs

@pytest.mark.parametrize("raw,want", [
    ("http://h:8000/v1", "http://h:8000/v1"),
    ("http://h:8000/v1/", "http://h:8000/v1"),
    ("http://h:8000/v1/chat/completions", "http://h:8000/v1"),
    ("http://h:8000/v1/chat/completions/", "http://h:8000/v1"),
    ("http://h:8000/v1/models", "http://h:8000/v1"),
    ("http://h:8000", "http://h:8000/v1"),
    ("https://proxy.example/llm/v1/completions", "https://proxy.example/llm/v1"),
    ("  http://198.51.100.1:8000/  ", "http://198.51.100.1:8000/v1"),
])
def test_base_url_is_normalised_to_v1(raw, want):
    assert pi_config.normalise_base_url(raw) == want


@pytest.mark.parametrize("raw", ["", "h:8000/v1", "ftp://h/v1", "http://h:8000/v1 x"])
def test_bad_base_url_is_refused(raw):
    with pytest.raises(UserError, match="is not an http"):
        pi_config.normalise_base_url(raw)


@pytest.mark.parametrize("version,want", [
    ("1.6.0", "$DSV41_API_KEY"),
    ("0.77.0", "$DSV41_API_KEY"),
    ("pi 0.80.2\n", "$DSV41_API_KEY"),
    ("0.76.9", "!printenv DSV41_API_KEY"),
    ("0.73.1", "!printenv DSV41_API_KEY"),
    ("", "!printenv DSV41_API_KEY"),
])
def test_key_reference_follows_pi_version(version, want):
    assert pi_config.key_reference(version) == want


def test_key_env_renames_the_variable_and_must_be_a_name():
    assert pi_config.key_reference("1.6.0", "SPARK_KEY") == "$SPARK_KEY"
    assert pi_config.key_reference("0.70.0", "SPARK_KEY") == "!printenv SPARK_KEY"
    with pytest.raises(UserError, match="KEY_ENV"):
        pi_config.key_reference("1.6.0", "X; rm -rf ~")


def test_settings_from_env():
    cfg = pi_config.settings_from_env({"MAX_LEN": "131072", "SET_DEFAULT": "1", "KEY_ENV": "K",
                                       "PI_CODING_AGENT_DIR": "/tmp/x y"})
    assert cfg == {"max_len": 131072, "set_default": True, "key_env": "K", "pi_dir": "/tmp/x y"}
    cfg = pi_config.settings_from_env({})
    assert cfg["max_len"] == 262144 and cfg["set_default"] is False
    assert cfg["pi_dir"] == os.path.expanduser("~/.pi/agent")
    with pytest.raises(UserError, match="MAX_LEN"):
        pi_config.settings_from_env({"MAX_LEN": "256k"})
    with pytest.raises(UserError, match="SET_DEFAULT"):
        pi_config.settings_from_env({"SET_DEFAULT": "maybe"})


@pytest.mark.parametrize("pi_dir", ["agent", "./x", "/", "~", "~/"])
def test_a_pi_dir_that_would_scatter_its_files_is_one_line_and_creates_nothing(pi_dir, tmp_path, monkeypatch,
                                                                               capsys):
    monkeypatch.chdir(tmp_path)
    code = pi_config.main(["--base-url", URL, "--pi-version", "1.6.0"], env={"PI_CODING_AGENT_DIR": pi_dir})
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"dsv41: PI_CODING_AGENT_DIR={pi_dir!r} is not valid: give Pi's own folder"), err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- lenient JSON

def test_comments_and_trailing_commas_are_tolerated_and_strings_survive():
    data = pi_config.parse_lenient(MODELS, "models.json")
    ollama = data["providers"]["ollama"]
    assert ollama["baseUrl"] == "http://localhost:11434/v1"
    assert ollama["headers"] == {"X-Note": "a /* not a comment */ b", "X-Quote": 'say "hi" // still a string'}
    assert ollama["models"] == [{"id": "qwen2.5-coder:7b"}]


@pytest.mark.parametrize("text,pos", [
    ('{\n  "a": 1\n  "b": 2\n}', "3:3"),
    ('{\n  // c\n  "a": [1, 2,, 3]\n}', "3:14"),
    ('{"a": "http://x" /* open\n', "1:18"),
    ('[1, 2]', "1:1"),
])
def test_malformed_json_names_file_and_position(text, pos):
    with pytest.raises(UserError) as err:
        pi_config.parse_lenient(text, "/p/models.json")
    assert str(err.value).startswith(f"/p/models.json:{pos}: ")
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- schema subset

SCHEMA = {
    "type": "object", "required": ["providers"],
    "properties": {"providers": {"type": "object", "patternProperties": {"^.*$": {"$ref": "#/$defs/P"}}}},
    "$defs": {"P": {"type": "object", "properties": {
        "baseUrl": {"type": "string", "minLength": 1},
        "mode": {"anyOf": [{"const": "a"}, {"const": "b"}]},
        "n": {"type": "number", "exclusiveMinimum": 0},
        "models": {"type": "array", "maxItems": 2, "items": {"type": "object", "required": ["id"]}},
        "input": {"type": "array", "items": {"enum": ["text", "image"]}}}}},
}


def test_schema_subset_accepts_valid_and_names_each_problem():
    good = {"providers": {"x": {"baseUrl": "u", "mode": "b", "n": 3, "models": [{"id": "m"}], "input": ["text"]}}}
    assert pi_config.validate(good, SCHEMA) == []
    bad = {"providers": {"x": {"baseUrl": "", "mode": "c", "n": 0, "models": [{}, {}, {}], "input": ["audio"]}}}
    errs = pi_config.validate(bad, SCHEMA)
    for where in ("$.providers.x.baseUrl", "$.providers.x.mode", "$.providers.x.n",
                  "$.providers.x.models[0]", "$.providers.x.models:", "$.providers.x.input[0]"):
        assert any(e.startswith(where) for e in errs), (where, errs)
    assert pi_config.validate({"providers": {"x": {"n": True}}}, SCHEMA)  # bool is not a number
    assert pi_config.validate({}, SCHEMA) == ["$: missing 'providers'"]


@pytest.mark.skipif(not REAL_SCHEMA.exists(), reason="Pi's models.schema.json not cached (run tests/setup/pi.sh)")
def test_entry_passes_pis_real_schema_and_a_broken_provider_is_refused(pi_dir):
    schema = json.loads(REAL_SCHEMA.read_text())
    entry = pi_config.provider_entry(URL, "$DSV41_API_KEY", 262144)
    assert pi_config.validate({"providers": {"dsv41-sparks": entry}}, schema) == []
    (pi_dir / "models.json").write_text('{"providers": {"bad": {"models": [{"name": "no id"}]}}}')
    before = listing(pi_dir)
    with pytest.raises(UserError, match=r"models schema \(\$\.providers\.bad\.models\[0\]: missing 'id'"):
        install(pi_dir, schema_path=str(REAL_SCHEMA))
    assert listing(pi_dir) == before


def test_find_schema_walks_up_from_the_pi_executable(tmp_path):
    pkg = tmp_path / "lib/node_modules/@earendil-works/pi-coding-agent"
    (pkg / "dist/bundle").mkdir(parents=True)
    (pkg / "schemas").mkdir()
    (pkg / "package.json").write_text("{}")
    (pkg / "schemas/models.schema.json").write_text("{}")
    (pkg / "dist/bundle/cli.js").write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/pi").symlink_to(pkg / "dist/bundle/cli.js")
    assert pi_config.find_schema(str(tmp_path / "bin/pi")) == str(pkg / "schemas/models.schema.json")
    (pkg / "schemas/models.schema.json").unlink()
    assert pi_config.find_schema(str(tmp_path / "bin/pi")) is None


# ---------------------------------------------------------------- editing the Pi dir

def test_adds_provider_keeps_others_and_backs_up(pi_dir):
    install(pi_dir, max_len=131072)
    data = json.loads((pi_dir / "models.json").read_text())
    assert data["providers"]["ollama"] == pi_config.parse_lenient(MODELS, "m")["providers"]["ollama"]
    entry = data["providers"]["dsv41-sparks"]
    assert entry["baseUrl"] == URL and entry["api"] == "openai-completions"
    assert entry["apiKey"] == "$DSV41_API_KEY"
    model = entry["models"][0]
    assert model["id"] == "deepseek-v4.1-flash" and model["contextWindow"] == 131072
    assert model["input"] == ["text", "image"] and model["reasoning"] is True
    assert entry["compat"]["supportsDeveloperRole"] is False and entry["compat"]["supportsStore"] is False
    assert (pi_dir / "models.json.bak-20261130-120000").read_text() == MODELS
    assert (pi_dir / "extensions").exists() is False  # no extension given
    assert not (pi_dir / "settings.json").exists()


def test_replaces_only_our_provider_in_place(pi_dir):
    (pi_dir / "models.json").write_text(json.dumps({"providers": {
        "a": {"baseUrl": "http://a/v1", "api": "openai-completions", "models": [{"id": "x"}]},
        "dsv41-sparks": {"baseUrl": "http://old/v1", "api": "x", "apiKey": "old", "models": [{"id": "old"}]},
        "z": {"baseUrl": "http://z/v1", "api": "openai-completions", "models": [{"id": "y"}]}}}))
    install(pi_dir)
    providers = json.loads((pi_dir / "models.json").read_text())["providers"]
    assert list(providers) == ["a", "dsv41-sparks", "z"]
    assert providers["dsv41-sparks"]["baseUrl"] == URL
    assert [m["id"] for m in providers["dsv41-sparks"]["models"]] == ["deepseek-v4.1-flash"]
    assert providers["a"]["models"] == [{"id": "x"}] and providers["z"]["models"] == [{"id": "y"}]


def test_enabled_models_appended_only_when_the_list_exists(pi_dir):
    (pi_dir / "settings.json").write_text('{"enabledModels": ["ollama/*coder*"], "theme": "dark"}')
    install(pi_dir)
    settings = json.loads((pi_dir / "settings.json").read_text())
    assert settings == {"enabledModels": ["ollama/*coder*", FULL], "theme": "dark"}
    assert "defaultModel" not in settings
    assert (pi_dir / "settings.json.bak-20261130-120000").exists()

    (pi_dir / "settings.json").write_text('{"theme": "light"}')
    install(pi_dir, now=datetime.datetime(2026, 12, 1))
    assert json.loads((pi_dir / "settings.json").read_text()) == {"theme": "light"}


def test_enabled_models_already_matching_is_left_alone(pi_dir):
    (pi_dir / "settings.json").write_text('{"enabledModels": ["dsv41-sparks/*"]}')
    install(pi_dir)
    assert json.loads((pi_dir / "settings.json").read_text()) == {"enabledModels": ["dsv41-sparks/*"]}
    assert not list(pi_dir.glob("settings.json.bak-*"))


def test_set_default_sets_provider_and_model(pi_dir):
    install(pi_dir, set_default=True)
    settings = json.loads((pi_dir / "settings.json").read_text())
    assert settings == {"defaultProvider": "dsv41-sparks", "defaultModel": "deepseek-v4.1-flash"}

    (pi_dir / "settings.json").write_text('{"defaultProvider": "ollama", "defaultModel": "q", "enabledModels": ["ollama/q"]}')
    install(pi_dir, set_default=True, now=datetime.datetime(2026, 12, 1))
    settings = json.loads((pi_dir / "settings.json").read_text())
    assert settings["defaultProvider"] == "dsv41-sparks" and settings["enabledModels"] == ["ollama/q", FULL]


def test_second_run_changes_nothing(pi_dir):
    ext = Path(pi_config.__file__).with_name("dsv41-sparks.ts")
    (pi_dir / "settings.json").write_text('{"enabledModels": []}')
    kw = dict(set_default=True, extension_src=str(ext))
    assert len(install(pi_dir, **kw)) == 3
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in pi_dir.rglob("*") if p.is_file()}
    assert pi_config.plan(str(pi_dir), URL + "/chat/completions", "1.6.0", **kw) == []
    assert install(pi_dir, now=datetime.datetime(2027, 1, 1), **kw) == []
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in pi_dir.rglob("*") if p.is_file()}
    assert after == before
    assert (pi_dir / "extensions/dsv41-sparks.ts").read_bytes() == ext.read_bytes()
    # a changed input does change the file (and takes a new backup)
    install(pi_dir, url="http://other:8000", now=datetime.datetime(2027, 1, 2), **kw)
    assert len(list(pi_dir.glob("models.json.bak-*"))) == 2


def test_comments_survive_when_nothing_changes(pi_dir):
    install(pi_dir)
    text = (pi_dir / "models.json").read_text()
    with_comment = "// mine\n" + text
    (pi_dir / "models.json").write_text(with_comment)
    assert install(pi_dir) == []
    assert (pi_dir / "models.json").read_text() == with_comment


@pytest.mark.parametrize("name", ["models.json", "settings.json"])
def test_malformed_file_writes_nothing(pi_dir, name):
    (pi_dir / "settings.json").write_text('{"enabledModels": []}')
    (pi_dir / name).write_text('{\n  "providers": {,}\n}\n')
    before = listing(pi_dir)
    with pytest.raises(UserError, match=rf"^{pi_dir}/{name}:2:17: malformed JSON"):
        install(pi_dir, set_default=True, extension_src=str(Path(pi_config.__file__).with_name("dsv41-sparks.ts")))
    assert listing(pi_dir) == before


def test_main_prints_one_line_and_exits_2(pi_dir, capsys):
    (pi_dir / "models.json").write_text('{"providers": }')
    code = pi_config.main(["--base-url", URL, "--pi-version", "1.6.0"], env={"PI_CODING_AGENT_DIR": str(pi_dir)})
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"dsv41: {pi_dir}/models.json:1:15: malformed JSON") and err.count("\n") == 1


def test_main_installs_extension_and_never_writes_the_key(pi_dir, monkeypatch, capsys):
    monkeypatch.setenv("DSV41_API_KEY", "sk-secret-unit-4242")
    monkeypatch.setenv("SPARK_KEY", "sk-secret-unit-4242")
    env = {"PI_CODING_AGENT_DIR": str(pi_dir), "SET_DEFAULT": "1", "KEY_ENV": "SPARK_KEY", "MAX_LEN": "65536"}
    assert pi_config.main(["--base-url", URL + "/", "--pi-version", "1.6.0"], env=env) == 0
    out = capsys.readouterr().out
    assert "created" in out and "extensions/dsv41-sparks.ts" in out
    files = listing(pi_dir)
    assert not [f for f, data in files.items() if b"sk-secret-unit-4242" in data]
    entry = json.loads(files["models.json"])["providers"]["dsv41-sparks"]
    assert entry["apiKey"] == "$SPARK_KEY" and entry["models"][0]["contextWindow"] == 65536
    assert "ctx.model?.provider" in files["extensions/dsv41-sparks.ts"].decode()


def test_file_mode_is_kept_and_symlinks_are_followed(pi_dir, tmp_path):
    real = tmp_path / "dotfiles/models.json"
    real.parent.mkdir()
    real.write_text(MODELS)
    real.chmod(0o600)
    (pi_dir / "models.json").unlink()
    (pi_dir / "models.json").symlink_to(real)
    install(pi_dir)
    assert (pi_dir / "models.json").is_symlink()
    assert "dsv41-sparks" in json.loads(real.read_text())["providers"]
    assert real.stat().st_mode & 0o777 == 0o600
    assert not [p for p in real.parent.iterdir() if p.name.startswith(".dsv41-")]  # no temp left
