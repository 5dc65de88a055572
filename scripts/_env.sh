# Sourced by scripts/test and scripts/demo: make the dev environments, idempotently.
#   .venv           the project with its test extras on current PyPI releases
#   .venv-bookworm  the runtime stack Debian 12 ships, to run the agent on it too
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

# Debian packages the demo needs: the faults (nftables, iproute2) and venvs.
DEMO_DEBS=(nftables iproute2 python3-venv)
# ...the benchmark: a stand-in SD card (ext4 on a loop device) to count the queue's wear.
BENCH_DEBS=("${DEMO_DEBS[@]}" e2fsprogs mount)
# ...and the tests, on top: the card again (a power cut), systemd-analyze, building and
# linting the .deb, booting a Debian with systemd as PID 1 to install it into
# (systemd-nspawn, debootstrap), and the real ScreenTinker servers (Node and npm, and a
# C++ toolchain with python3 for better-sqlite3, which npm builds from source), and a
# TLS-inspecting box in front of the server (socat, its certificates made by openssl),
# and signed releases for the self-update (gnupg to sign, gpgv to check); working
# hours' X11 recipe on a real X server (Xvfb, xset); a fleet of two nodes behind a load
# balancer, one of them hung (haproxy; redis-server shares the nodes' Socket.IO emits).
# A signed APT repository of the releases, as scripts/release makes it (reprepro).
# The screen's picture captured from a real X server (xwd, ImageMagick's import), and its
# volume set and read back on a real, headless PipeWire (wpctl, pactl, ALSA's amixer
# through the pulse plugin) on a session bus of its own (tests/test_controls.py).
# The doctor's clock judged against the server's with this process three days back
# (libfaketime, tests/test_doctor.py). The zones set-timezone checks a name against
# (tzdata; tests/test_operator_commands.py). The alert rules checked and fired by
# Prometheus' own promtool and server, on what a real node_exporter serves of the
# agent's textfile (prometheus, prometheus-node-exporter; tests/test_alert_rules.py,
# tests/test_grants.py). The real agent's fsyncs counted as they reach the card
# (strace; tests/test_credentials_hostile.py). The link's and the commands' types checked
# by Debian's mypy on the system python3 (python3-mypy, python3-typeshed for requests'
# stubs; tests/test_types.py, mypy.ini).
# Raspberry Pi OS's Wayland desktop: a real headless wlroots compositor (sway), its
# background client (swaybg), the agent's capture and read-back (grim, wlr-randr), and
# the recipe's grant (acl; tests/test_wayland.py).
# A real DHCP server and client for the network healer's lost lease (busybox's udhcpd
# and udhcpc; tests/test_network_heal_netns.py).
TEST_DEBS=("${BENCH_DEBS[@]}" systemd lintian debhelper dh-python pybuild-plugin-pyproject
           python3-all python3-setuptools dpkg-dev systemd-container debootstrap
           build-essential python3 socat openssl tinyproxy gnupg gpgv xvfb x11-xserver-utils
           haproxy redis-server reprepro imagemagick x11-apps
           pipewire pipewire-bin wireplumber pipewire-pulse pulseaudio-utils alsa-utils
           libasound2-plugins dbus-daemon faketime tzdata
           prometheus prometheus-node-exporter strace python3-mypy python3-typeshed sway swaybg grim
           wlr-randr acl busybox)
# Node: the machine's own where it has one (NodeSource's nodejs carries npm; Debian's
# npm would conflict with it), else Debian's.
command -v node >/dev/null || TEST_DEBS+=(nodejs)
command -v npm >/dev/null || TEST_DEBS+=(npm)

host_tools() {  # host_tools PACKAGE...: apt-get install the ones not installed yet
    local need=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
    done
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

dev_envs() {  # dev_envs PACKAGE...
    host_tools "$@"
    make_venv "$REPO/.venv" -e "$REPO[test,bench]"
    make_venv "$REPO/.venv-bookworm" -r "$REPO/requirements/bookworm.txt"
}

peers() {  # the real ScreenTinker servers, prepared outside the repository (once per lock)
    # from ../shared/peers, beside the clone; a failure is one line per server, and the
    # tests that need that server then fail saying why
    "$REPO/.venv/bin/python" -m devtools.screentinker_peer prepare \
        || echo "the real ScreenTinker tier will fail: see the line above" >&2
}
