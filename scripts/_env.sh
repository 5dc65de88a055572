# Sourced by scripts/test and scripts/demo: make the dev environments, idempotently.
#   .venv           the project with its test extras on current PyPI releases
#   .venv-bookworm  the runtime stack Debian 12 ships, to run the agent on it too
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

host_tools() {
    # nftables and iproute2 make the silent-drop faults; python3-venv makes venvs on Debian.
    local need=()
    command -v nft >/dev/null || need+=(nftables)
    command -v ip >/dev/null || need+=(iproute2)
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
    if [ ${#need[@]} -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "missing ${need[*]}: install them (apt-get install ${need[*]}) or run as root" >&2
            exit 1
        fi
        echo "installing ${need[*]} with apt-get" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
}

make_venv() {  # make_venv DIR PIP-ARGS...
    local dir="$1"; shift
    local stamp="$dir/.installed"
    local want
    want="$(cat "$REPO/pyproject.toml" "$REPO/requirements/"*.txt | sha256sum | cut -c1-16) $*"
    if [ -x "$dir/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    echo "preparing $dir" >&2
    "$PYTHON" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "$@"
    echo "$want" > "$stamp"
}

dev_envs() {
    host_tools
    make_venv "$REPO/.venv" -e "$REPO[test]"
    make_venv "$REPO/.venv-bookworm" -r "$REPO/requirements/bookworm.txt"
}
