"""`pip install .` on a machine without the repo: the memory guard's command and the client tools work
from the installed package alone (a laptop that only talks to the API needs nothing else)."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"                   # the project's files only: no build/ left over from another build
    shutil.copytree(os.path.join(ROOT, "lib"), src / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "wheels"), str(src)],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "v")], check=True)
    pip = [str(tmp / "v/bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["--no-deps", *map(str, (tmp / "wheels").glob("dsv41-*.whl"))], check=True, capture_output=True)
    subprocess.run(pip + ["requests==2.34.2", "prometheus_client==0.26.0"], check=True,   # what the client needs
                   capture_output=True)
    return tmp


def run(installed, *argv):
    """Run from a directory without the repo, with the installed package only."""
    env = {"PATH": f"{installed}/v/bin:/usr/bin:/bin", "HOME": str(installed)}
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=installed, env=env, timeout=60)


def test_the_memory_guard_command_runs_from_the_package(installed):
    r = run(installed, "dsv41-memguard", "--help")
    assert r.returncode == 0 and "--floor-gib" in r.stdout
    r = run(installed, "dsv41-memguard", "--floor-gib", "0")
    assert r.returncode == 2 and r.stderr.strip().startswith("dsv41: --floor-gib (MEMGUARD_GIB)='0' is not valid")


@pytest.mark.parametrize("tool", ["smoke", "bench"])
def test_the_client_tools_run_from_the_package(installed, tool):
    py = f"{installed}/v/bin/python"
    r = run(installed, py, "-m", f"dsv41.client.{tool}", "--help")
    assert r.returncode == 0 and "usage:" in r.stdout
    url = ["http://127.0.0.1:9/v1"] if tool == "smoke" else ["--url", "http://127.0.0.1:9/v1", "--out", "b.json"]
    r = run(installed, py, "-m", f"dsv41.client.{tool}", *url)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1 and "cannot reach" in r.stderr   # a server fault


def test_the_package_holds_what_runs_without_the_checkout(installed):
    """dsv41.head, the settings and the engine's recipe need the checkout (dodo.py, conf/, units/): they are
    not in the wheel; py.typed is, and every module in it imports from the wheel alone."""
    import zipfile
    [wheel] = (installed / "wheels").glob("dsv41-*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    assert "dsv41/py.typed" in files and "dsv41/node/memguard/guard.py" in files and "dsv41/client/smoke.py" in files
    assert not [f for f in files if f.startswith(("dsv41/head/", "dsv41/settings/", "dsv41/vllm/"))]
    modules = [f[:-3].replace("/", ".").removesuffix(".__init__") for f in files
               if f.startswith("dsv41/") and f.endswith(".py") and not f.endswith("__main__.py")]
    r = run(installed, f"{installed}/v/bin/python", "-c",
            f"import importlib\nfor m in {modules!r}: importlib.import_module(m)")
    assert r.returncode == 0, r.stderr
