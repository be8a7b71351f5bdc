"""Other version control systems' repository settings below a project's top (review 28):
Mercurial's, Jujutsu's and Sapling's hooks, extensions and pagers that `hg status`, `jj
log` and `sl status` run there, and a shared repository's path, whose settings they read
instead. run.protected keeps them like its DEEP names; the repositories' data is the
workload's to change. A `.hg`, `.jj` or `.sl` that is a link or a file is kept itself
(review 29: a link to a directory of the workload's elsewhere in the project)."""

from __future__ import annotations

import os
from pathlib import Path

VCS_SETTINGS = {".hg": ("hgrc", "hgrc-not-shared", "sharedpath"),
                ".jj": ("repo/config.toml", "repo", "workspace-config.toml"),
                ".sl": ("config", "sharedpath")}


def vcs_setting(p: Path) -> bool:
    """P is a setting to keep: there, and `.jj/repo` only as a pointer (a file or a link)
    to another repository (its directory is the repository's data)."""
    return os.path.lexists(p) and (p.name != "repo" or os.path.islink(p) or not p.is_dir())
