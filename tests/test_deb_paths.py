"""Every path the installed package's documentation and units name exists on a screen
(issue #43: the units and the man page named /usr/share/doc/edge-agent/README.md while
the package installed README.md.gz). Read from the built .deb itself: what is under
/usr must be in it; a directory under /etc, /var or /run must be one the package's
maintainer scripts or units make."""
import re
import subprocess
from pathlib import Path

# a path as the pages write it; globs, placeholders and examples are not files
PATH = re.compile(r"(?<![\w.~])(/(?:usr|etc|var|run|lib)/[A-Za-z0-9_@./\\-]*[A-Za-z0-9_/-])")
EXAMPLES = ("/etc/edge-agent/site-ca.pem", "/etc/edge-agent/ca.pem", "/etc/edge-agent/client.",
            "/run/user/", "/usr/local/share/ca-certificates/")


def _extract(deb, out: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True, timeout=60)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(out / "DEBIAN")], check=True, timeout=60)
    return out


def _named(root: Path) -> dict[str, set[str]]:
    """{path: the installed files that name it}"""
    sources = [*root.glob("usr/lib/systemd/system/*"), *root.glob("lib/systemd/system/*"),
               *root.glob("usr/share/man/man*/*"), *root.glob("usr/share/doc/edge-agent/*.md*"),
               *root.glob("usr/share/doc/edge-agent/docs/*.md*"),
               *root.glob("usr/lib/edge-agent/agent.toml")]
    named: dict[str, set[str]] = {}
    for src in sources:
        if src.suffix == ".gz":
            text = subprocess.run(["zcat", str(src)], capture_output=True, text=True).stdout
        else:
            text = src.read_text()
        for m in PATH.finditer(text.replace("\\-", "-").replace("\\e", "\\")):
            path = m.group(1).rstrip(".,/")
            if "*" in path or "<" in path or path.startswith(EXAMPLES) or "XXXX" in path:
                continue
            named.setdefault(path, set()).add(str(src.relative_to(root)))
    return named


def test_every_path_the_docs_and_units_name_is_installed_or_made(built_debs, tmp_path):
    root = _extract(built_debs[0], tmp_path / "deb")
    named = _named(root)
    assert "/usr/share/doc/edge-agent/README.md" in named      # the units name it
    assert "/run/edge-agent/pairing-code" in named             # the man page's FILES
    makers = "\n".join(p.read_text() for p in [*root.glob("usr/lib/systemd/system/*"),
                                              *(root / "DEBIAN").glob("post*"),
                                              *(root / "DEBIAN").glob("pre*"),
                                              # root's side makes its own directories
                                              *root.glob("usr/lib/python3/dist-packages/"
                                                         "agent/*.py")])
    made = set(re.findall(r"(?:StateDirectory|RuntimeDirectory|ConfigurationDirectory)="
                          r"([\w-]+)", makers))
    missing = []
    for path, where in sorted(named.items()):
        if path.startswith("/usr/") or path.startswith("/lib/"):
            # merged /usr: /lib is /usr/lib on trixie, and the package ships only /usr
            on_disk = root / path.lstrip("/")
            alt = root / ("usr" + path) if path.startswith("/lib/") else on_disk
            if not (on_disk.exists() or alt.exists() or _system(path)):
                missing.append(f"{path} (named in {', '.join(sorted(where))})")
            continue
        shipped = root / path.lstrip("/")
        if shipped.is_dir() or shipped.is_symlink():
            continue   # in the .deb itself (node_exporter's textfile directory, its link)
        parts = path.split("/")   # the package's directory: /run/x, /etc/x, /var/lib/x
        top = "/".join(parts[:4] if parts[1] == "var" else parts[:3])
        base = top.rsplit("/", 1)[-1]
        if base in made or top in makers or _system(path):
            continue
        missing.append(f"{path} (named in {', '.join(sorted(where))}): nothing makes {top}")
    assert not missing, "\n".join(missing)


# what Debian itself provides, named by the pages as such
SYSTEM = ("/etc/machine-id", "/etc/ssl/certs", "/etc/systemd/system", "/run/systemd",
          "/usr/bin/python3", "/usr/lib/python3/dist-packages", "/usr/lib/systemd/catalog",
          "/etc/os-release", "/usr/share/polkit-1", "/var/log", "/etc/apt", "/usr/share/keyrings",
          "/var/cache/", "/usr/sbin/update-ca-certificates", "/etc/default/", "/lib/systemd/system",
          "/etc/hostname", "/run/user", "/var/lib/apt", "/usr/local/share/ca-certificates",
          "/var/lib/systemd/pstore",   # systemd-pstore's archive (systemd's tmpfiles make it)
          "/usr/bin/mkdir", "/usr/bin/setpriv",   # coreutils', util-linux's (the Wayland recipe)
          "/run/network")   # ifupdown's state (the network healer reads its ifstate)


def _system(path: str) -> bool:
    return path.startswith(SYSTEM)
