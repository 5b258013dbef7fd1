#!/usr/bin/env bash
# Install Pi if missing and register the dsv41-sparks provider.
# Usage: pi/install.sh BASE_URL   (or DSV41_BASE_URL=...; e.g. http://HEAD:8000/v1)
# Environment: PI_CODING_AGENT_DIR (~/.pi/agent), MAX_LEN (262144), SET_DEFAULT=1, KEY_ENV (DSV41_API_KEY),
# PI_VERSION (the Pi version npm installs when pi is missing; default latest).
# Needs Node.js >= 22.19, npm (only to install Pi) and python3; nothing else from this project.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PKG=@earendil-works/pi-coding-agent
die() { echo "dsv41: $*" >&2; exit 2; }

base_url=${1:-${DSV41_BASE_URL:-}}
[ -n "$base_url" ] || die "no API base URL: run pi/install.sh http://HEAD:8000/v1 (or set DSV41_BASE_URL)"
command -v python3 >/dev/null || die "python3 not found: install it (e.g. apt-get install python3), then re-run"

get_node="install Node.js 22 LTS (https://nodejs.org/en/download, or 'nvm install 22'), put it first on PATH, then re-run"
command -v node >/dev/null || die "Node.js not found: Pi needs Node.js >= 22.19; $get_node"
node_version=$(node -p process.versions.node)
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 22 || (a === 22 && b >= 19) ? 0 : 1)' ||
    die "Pi needs Node.js >= 22.19 but $(command -v node) is $node_version; $get_node"

# Check the inputs before changing anything.
url=$(python3 "$here/pi_config.py" --check --base-url "$base_url")
echo "pi: API base URL $url"

if ! command -v pi >/dev/null; then
    command -v npm >/dev/null || die "pi and npm not found: install npm (it comes with Node.js), then re-run"
    echo "pi: installing $PKG@${PI_VERSION:-latest} with npm (about 15 s)"
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    if ! npm install -g --no-audit --no-fund "$PKG@${PI_VERSION:-latest}" 2>"$log"; then
        cat "$log" >&2
        if grep -q -e EACCES -e EPERM "$log"; then
            prefix=$(npm prefix -g)
            grep -qF "$prefix" "$log" ||
                die "npm hit a permission error (see above): fix the ownership of the path it names (e.g. ~/.npm), then re-run"
            die "npm cannot write to its global prefix $prefix: use one in your home dir: npm config set prefix ~/.npm-global && export PATH=~/.npm-global/bin:\$PATH (also in ~/.profile), then re-run"
        fi
        die "npm install -g $PKG failed (see the npm error above): fix it, then re-run"
    fi
    hash -r
    if ! command -v pi >/dev/null; then
        bin=$(npm prefix -g)/bin
        [ -x "$bin/pi" ] || die "npm installed $PKG but no pi executable is on PATH: add $(npm prefix -g)/bin to PATH, then re-run"
        PATH=$bin:$PATH
        echo "pi: add $bin to PATH to start pi"
    fi
fi

pi_bin=$(command -v pi)
err=$(mktemp)
pi_version=$(pi --version 2>"$err" | tail -n1) && [ -n "$pi_version" ] ||
    die "'$pi_bin --version' failed ($(tail -n1 "$err")): reinstall Pi with npm install -g $PKG, then re-run"
rm -f "$err"
echo "pi: $pi_bin version $pi_version"

python3 "$here/pi_config.py" --base-url "$url" --pi-version "$pi_version" --pi-bin "$pi_bin"
echo "pi: ready. Export ${KEY_ENV:-DSV41_API_KEY} in Pi's shell, then: pi --model dsv41-sparks/deepseek-v4.1-flash"
