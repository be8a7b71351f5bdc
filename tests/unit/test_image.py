"""Runner image helpers: the filesystem scan that refuses setuid/setgid files and
undeclared file capabilities, the inputs hash that decides rebuilds, the lock edits."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kooi import image

REPO = Path(__file__).resolve().parents[2]


def fs_tar(entries: list[tuple[str, int, dict | None]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode, pax in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            if name.endswith("/"):
                ti.type = tarfile.DIRTYPE
            if pax:
                ti.pax_headers = pax
            tar.addfile(ti, io.BytesIO(b"") if ti.isfile() else None)
    buf.seek(0)
    return buf


CAP = {image.CAP_XATTR: "\x01\x00\x00\x02"}


def test_a_clean_filesystem_has_no_offenders():
    assert image.scan_filesystem(fs_tar([("usr/", 0o755, None), ("usr/bin/ls", 0o755, None)])) == []


def test_setuid_setgid_and_capabilities_are_listed():
    found = image.scan_filesystem(fs_tar([
        ("usr/bin/passwd", 0o4755, None), ("usr/bin/wall", 0o2755, None), ("var/mail/", 0o2775, None),
        ("usr/bin/ping", 0o755, CAP), ("usr/bin/ok", 0o755, None)]))
    assert found == ["setuid 0o4755 /usr/bin/passwd", "setgid 0o2755 /usr/bin/wall", "setgid 0o2775 /var/mail",
                     "file capability /usr/bin/ping"]


def test_declared_capabilities_pass():
    assert image.scan_filesystem(fs_tar([("usr/bin/ping", 0o755, CAP)]), ("/usr/bin/ping cap_net_raw=ep",)) == []


def test_chunked_export_stream_is_read_whole():
    data = fs_tar([("usr/bin/su", 0o4755, None)]).getvalue()
    chunks = iter([data[i:i + 100] for i in range(0, len(data), 100)])
    assert image.scan_filesystem(image._ChunkReader(chunks)) == ["setuid 0o4755 /usr/bin/su"]


def test_inputs_hash_follows_content_mode_and_base(tmp_path):
    (tmp_path / "Containerfile").write_text("FROM x\n")
    (tmp_path / "ca").mkdir()
    (tmp_path / "ca" / "a.crt").write_text("cert")
    base = "sha256:" + "a" * 64
    h0 = image.inputs_hash(tmp_path, base)
    assert image.inputs_hash(tmp_path, base) == h0
    assert image.inputs_hash(tmp_path, "sha256:" + "b" * 64) != h0
    (tmp_path / "ca" / "a.crt").chmod(0o600)
    h1 = image.inputs_hash(tmp_path, base)
    assert h1 != h0
    (tmp_path / "ca" / "a.crt").write_text("other cert")
    assert image.inputs_hash(tmp_path, base) != h1


def test_the_shipped_lock_loads():
    lock = image.load_lock(REPO / "images/runner/lock.yml")
    assert image.DIGEST_RE.match(lock.base_digest) and lock.file_capabilities == ()


@pytest.mark.parametrize("text,err", [
    ("base: {ref: x}\n", "base.digest is missing"),
    ("base: {ref: x, digest: latest}\n", "is not sha256"),
    ("nobase: 1\n", "no 'base' mapping"),
    ("base: {ref: x, digest: 'sha256:" + "a" * 64 + "'}\nfile_capabilities: x\n", "file_capabilities"),
    # review 49: a version goes into the build's apt-get line as it is
    ("base: {ref: x, digest: 'sha256:" + "a" * 64 + "'}\napt: {packages: {curl: '8.1; id'}}\n", "Debian versions"),
    # review 50: so does a source
    ("base: {ref: x, digest: 'sha256:" + "a" * 64 + "'}\napt: {sources: [\"deb http://d/ t main' ; id ; echo '\"]}\n",
     "one-line apt sources"),
])
def test_bad_locks_are_refused(tmp_path, text, err):
    p = tmp_path / "lock.yml"
    p.write_text(text)
    with pytest.raises(image.ImageError, match=err):
        image.load_lock(p)


def test_pin_base_rewrites_only_the_digest(tmp_path):
    src = REPO / "images/runner/lock.yml"
    out = tmp_path / "lock.yml"
    new = "sha256:" + "c" * 64
    image.pin_base(src, new, out)
    before, after = src.read_text().splitlines(), out.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(changed) == 1 and changed[0][1] == f"  digest: {new}"
    with pytest.raises(image.ImageError):
        image.pin_base(src, "latest", out)


def test_refresh_packages_updates_pins(tmp_path):
    out = tmp_path / "lock.yml"
    changes = image.refresh_packages(REPO / "images/runner/lock.yml", {"git": "1:9.9-1", "nope": "1"}, out)
    assert changes == {"git": ("1:2.47.3-0+deb13u1", "1:9.9-1")}
    assert image.load_lock(out).raw["apt"]["packages"]["git"] == "1:9.9-1"
