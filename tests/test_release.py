"""scripts/release: the package built, signed and published into an APT repository made
with reprepro, checked as a screen checks it: apt with the repository's key as
signed-by, and gpgv against the key in update-keys for the fleet's update order."""
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import agent
from agent.update import signature
from devtools.harness import REPO
from devtools.releases import SigningKey

pytestmark = pytest.mark.skipif(shutil.which("reprepro") is None,
                                reason="reprepro is not installed (scripts/_env.sh TEST_DEBS)")


@pytest.fixture
def keys(tmp_path):
    """Throwaway signing keys; their gpg-agents stopped after the test."""
    made = []

    def make(name: str = "edge-agent release") -> SigningKey:
        made.append(SigningKey(tmp_path / name.replace(" ", "-"), name))
        return made[-1]
    yield make
    for key in made:
        subprocess.run(["gpgconf", "--homedir", str(key.home), "--kill", "all"],
                       capture_output=True, timeout=30)


def release(repo: Path, key: SigningKey, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "release"), "--gnupghome", str(key.home),
                           *extra, str(repo), "release@edge-agent.invalid"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def apt_root(tmp: Path, repo: Path, keyring: Path) -> list[str]:
    """apt-get's options for a private apt that knows only this repository, with its
    key as signed-by, as a screen's sources entry names it."""
    for d in ("etc/sources.list.d", "etc/preferences.d", "etc/apt.conf.d", "state/lists/partial",
              "cache/archives/partial"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "etc/sources.list").write_text(f"deb [signed-by={keyring}] file:{repo} stable main\n")
    (tmp / "state/status").write_text("")
    return ["-o", f"Dir::Etc={tmp}/etc", "-o", f"Dir::State={tmp}/state",
            "-o", f"Dir::State::status={tmp}/state/status", "-o", f"Dir::Cache={tmp}/cache",
            "-o", "Debug::NoLocking=1", "-o", "APT::Architecture=armhf",
            "-o", "APT::Sandbox::User=root"]


def test_a_release_is_built_signed_and_published_into_an_apt_repository_screens_verify(tmp_path, keys):
    key = keys()
    repo = tmp_path / "repo"
    r = release(repo, key)
    assert r.returncode == 0, r.stdout + r.stderr
    deb, sig = (Path(p) for p in r.stdout.split())
    version = f"{agent.__version__}-1"
    assert deb == repo / "pool" / "main" / "e" / "edge-agent" / f"edge-agent_{version}_all.deb"
    assert sig == deb.with_name(deb.name + ".sig")
    public = repo / "edge-agent-archive-keyring.gpg"

    # the Release file, signed both ways apt reads it, by the key and no other
    for args in (["InRelease"], ["Release.gpg", "Release"]):
        v = subprocess.run(["gpgv", "--keyring", str(public), *args], capture_output=True,
                           cwd=repo / "dists" / "stable", timeout=30)
        assert v.returncode == 0, v.stderr
    stranger = keys("stranger")
    v = subprocess.run(["gpgv", "--keyring", str(stranger.keyring), "InRelease"],
                       capture_output=True, cwd=repo / "dists" / "stable", timeout=30)
    assert v.returncode != 0, "gpgv took a key that did not sign it: the check proves nothing"

    # the package listed for a screen's architecture, with the pool file's checksum
    packages = (repo / "dists/stable/main/binary-armhf/Packages").read_text()
    entry = dict(re.findall(r"^(\w[\w-]*): (.*)$", packages, re.M))
    assert entry["Package"] == "edge-agent" and entry["Version"] == version, packages
    assert entry["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()

    # the detached signature, as the agent and root's installer check an update order's
    keys = tmp_path / "update-keys"
    keys.mkdir(mode=0o755)
    shutil.copy(public, keys / "release.gpg")
    os.chmod(keys / "release.gpg", 0o644)
    assert signature.verify(str(deb), sig.read_bytes(), str(keys))
    tampered = tmp_path / "tampered.deb"
    tampered.write_bytes(deb.read_bytes()[:-1] + b"\0")
    with pytest.raises(signature.SignatureError, match="bad signature"):
        signature.verify(str(tampered), sig.read_bytes(), str(keys))

    # apt, pointed at it with signed-by, fetches and verifies the indices and the package
    opts = apt_root(tmp_path / "apt", repo, public)
    up = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0 and not re.search(r"^(W|E):", up.stdout + up.stderr, re.M), \
        up.stdout + up.stderr
    policy = subprocess.run(["apt-cache", *opts, "policy", "edge-agent"], capture_output=True,
                            text=True, timeout=60).stdout
    assert f"Candidate: {version}" in policy, policy
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    dl = subprocess.run(["apt-get", *opts, "download", "edge-agent"], capture_output=True,
                        text=True, timeout=120, cwd=fetched, stdin=subprocess.DEVNULL)
    assert dl.returncode == 0, dl.stdout + dl.stderr
    assert (fetched / deb.name).read_bytes() == deb.read_bytes()

    # the same apt with another key as signed-by refuses the repository
    shutil.rmtree(tmp_path / "apt")
    opts = apt_root(tmp_path / "apt", repo, stranger.keyring)
    up = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, timeout=120)
    assert "NO_PUBKEY" in up.stdout + up.stderr or "not signed" in up.stdout + up.stderr, \
        up.stdout + up.stderr


def test_a_later_release_replaces_the_earlier_one_and_its_signature(tmp_path, built_debs, keys):
    """The next version published: the repository offers it, the earlier package and its
    signature leave the pool; an older one than the repository's is refused."""
    key = keys()
    repo = tmp_path / "repo"
    first = release(repo, key, "--deb", str(built_debs[0]))
    assert first.returncode == 0, first.stderr
    old_deb, old_sig = (Path(p) for p in first.stdout.split())
    later = release(repo, key, "--deb", str(built_debs[1]))
    assert later.returncode == 0, later.stderr
    deb, sig = (Path(p) for p in later.stdout.split())
    assert deb.name == built_debs[1].name and sig.exists()
    assert not old_deb.exists() and not old_sig.exists()
    packages = (repo / "dists/stable/main/binary-arm64/Packages").read_text()
    assert re.findall(r"^Version: (.*)$", packages, re.M) == [built_debs[1].name.split("_")[1]]
    older = release(repo, key, "--deb", str(built_debs[0]))
    assert older.returncode != 0 and "release:" in older.stderr, older.stdout + older.stderr


def test_release_without_a_usable_key_says_so_and_publishes_nothing(tmp_path, built_debs, keys):
    key = keys()
    r = subprocess.run([str(REPO / "scripts" / "release"), "--gnupghome", str(key.home),
                        "--deb", str(built_debs[0]), str(tmp_path / "repo"), "nobody@invalid"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "no secret key nobody@invalid" in r.stderr, r.stderr
    assert not (tmp_path / "repo" / "dists").exists()


def _fingerprint(key: SigningKey) -> str:
    out = key._gpg("--with-colons", "--list-secret-keys").stdout.decode()
    return next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))


def _listed(repo: Path, arch: str = "armhf") -> list[str]:
    packages = (repo / "dists/stable/main" / f"binary-{arch}" / "Packages").read_text()
    return re.findall(r"^Version: (.*)$", packages, re.M)


def test_a_retry_after_an_export_that_failed_publishes_what_it_says(tmp_path, built_debs, keys):
    """The signing key expired: reprepro takes the package into its database but cannot
    export signed indices, and the release fails. The key renewed, the retry finds the
    version in the database; the release exports anyway, and what it says published is
    what apt sees (it said so of the old indices before)."""
    key = keys()
    repo = tmp_path / "repo"
    assert release(repo, key, "--deb", str(built_debs[0])).returncode == 0
    v2 = built_debs[1].name.split("_")[1]
    fpr = _fingerprint(key)
    key._gpg("--quick-set-expire", fpr, "seconds=1")
    time.sleep(2)
    failed = release(repo, key, "--deb", str(built_debs[1]))
    assert failed.returncode != 0 and "release:" in failed.stderr, failed.stdout + failed.stderr
    assert _listed(repo) != [v2]
    again = release(repo, key, "--deb", str(built_debs[1]))
    assert again.returncode != 0, "the key still expired: nothing published"
    key._gpg("--quick-set-expire", fpr, "0")
    retry = release(repo, key, "--deb", str(built_debs[1]))
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert _listed(repo) == [v2], "said published, and apt's index lists it"
    opts = apt_root(tmp_path / "apt", repo, repo / "edge-agent-archive-keyring.gpg")
    up = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    policy = subprocess.run(["apt-cache", *opts, "policy", "edge-agent"], capture_output=True,
                            text=True, timeout=60).stdout
    assert f"Candidate: {v2}" in policy, policy


def test_a_repository_apt_would_not_see_the_version_in_is_no_release(tmp_path, built_debs, keys):
    """reprepro that takes the package and exports nothing, with success (its answer to
    a version already in its database): the release checks the repository as apt
    would, InRelease verified with the key and the version listed with the package's
    hash, and fails."""
    key = keys()
    repo = tmp_path / "repo"
    assert release(repo, key, "--deb", str(built_debs[0])).returncode == 0
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "reprepro").write_text(
        "#!/bin/sh\nfor a; do [ \"$a\" = export ] && exit 0; done\n"
        f"exec {shutil.which('reprepro')} --export=silent-never \"$@\"\n")
    (fake / "reprepro").chmod(0o755)
    r = subprocess.run([str(REPO / "scripts" / "release"), "--gnupghome", str(key.home),
                        "--deb", str(built_debs[1]), str(repo), "release@edge-agent.invalid"],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "apt would not see edge-agent" in r.stderr, r.stderr
    assert _listed(repo) == [built_debs[0].name.split("_")[1]]
