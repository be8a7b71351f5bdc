"""Pack the kooi package into one tar on the controller, so the shim role transfers one
file instead of one per module (the copy module's per-file round trips took 80-90 s per
run over a container connection).

Each member's mtime is derived from its content: the same tree packs byte for byte the
same on any checkout (unarchive then finds nothing to change), and a changed module gets
a new mtime, so Python's bytecode cache on the host never serves a stale module.
Usage: python3 pack.py SOURCE_DIR ARCHIVE
"""

import hashlib
import io
import sys
import tarfile
from pathlib import Path

EPOCH = 946684800  # 2000-01-01; content-derived offsets keep mtimes plausible


def pack(src: Path, dest: Path) -> None:
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for p in [src, *sorted(src.rglob("*"))]:
            rel = p.relative_to(src.parent).as_posix()
            if "__pycache__" in p.parts or p.suffix == ".pyc":
                continue
            info = tarfile.TarInfo(rel)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if p.is_dir():
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
                tar.addfile(info)
            elif p.is_file():
                data = p.read_bytes()
                info.size, info.mode = len(data), 0o644
                info.mtime = EPOCH + int(hashlib.sha256(data).hexdigest()[:7], 16)
                tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    pack(Path(sys.argv[1]).resolve(), Path(sys.argv[2]))
