"""Runner image variants (kooi_runner_images, issue 31): images a team declares in the
inventory, built FROM the pinned runner image with Debian packages of their own.

On the controller, before anything changes (roles/preflight, `kooi image variants`):
- the declaration is checked (names, packages, apt sources, environment);
- every package a variant adds is pinned to a version in the variants' lock, which kooi
  writes next to the inventory and the operator commits: a package without a pin is
  resolved from the archive's package indexes (the runner lock's sources and the
  variant's own), the newest version there; one the archive does not have fails the
  play, naming the variant and the package. A pin is never moved here: `kooi image lock
  --refresh-packages` does that for the runner lock, and removing a variant's entry
  from the lock re-resolves it.
On the host (roles/runner_image) the lock's versions are what apt installs, and the
variant is built, verified (no setuid file, its base the pinned runner image) and pinned
like the runner image (kooi.image).

A toolchain Debian does not package comes as a download recipe (`downloads`: an https
URL, the SHA-256 of what it serves, where it is unpacked): the build fetches it, and it
is unpacked only when it hashes to the recipe's sum. The sum is the pin: a recipe without
one fails the play before anything changes.
"""

from __future__ import annotations

import gzip
import lzma
import re
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SCHEMA = 1
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}\Z")
# Debian package names (policy 5.6.1), optionally with an architecture qualifier.
PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+\Z")
# One-line apt sources: `deb URI SUITE COMPONENT...` (no options: the archive's keys are
# the base image's, so only the Debian archive's own suites verify).
SOURCE_RE = re.compile(r"^deb (https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[A-Za-z0-9._~/-]*)?) ([a-z0-9.-]+)"
                       r"((?: [a-z0-9-]+)+)\Z")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# What the image gets literally (review 49: `$VAR` was expanded at build time, non-ASCII
# arrived as JSON escapes): printable ASCII but `$`, `\`, `"` and the backquote.
ENV_VALUE_RE = re.compile(r'^[ !#%-\[\]-_a-~]*\Z')
# Debian versions (policy 5.6.12): [epoch:]upstream[-revision], upstream from a digit.
# They go into the build's apt-get line: nothing else ever does (review 49: a version
# from the lock or an index over http was a shell command run as root in the build).
VERSION_RE = re.compile(r"^(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*\Z")
RESERVED = frozenset({"runner", "e2e"})
KEYS = frozenset({"description", "packages", "sources", "environment", "downloads"})
DOWNLOAD_KEYS = frozenset({"url", "sha256", "dest", "strip"})
# An archive the image build fetches: https only, no credentials, no spaces or quotes.
URL_RE = re.compile(r"^https://[A-Za-z0-9.-]+(?::[0-9]+)?/[A-Za-z0-9._~/%+@=-]*\Z")
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
# Where a download is unpacked: a directory of its own under /opt.
DEST_RE = re.compile(r"^/opt/[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# The most bytes of one package index kooi reads (trixie's main is about 60 MB unpacked).
MAX_INDEX = 256 << 20


class VariantError(Exception):
    """A declaration, lock or archive problem; the message names the variant and what to do."""


@dataclass(frozen=True)
class Download:
    """A toolchain the build fetches from URL, unpacks (a tar archive, gzip or xz) into
    DEST without its first STRIP path components, once it hashes to SHA256."""

    url: str
    sha256: str
    dest: str
    strip: int = 0


@dataclass(frozen=True)
class Variant:
    name: str
    packages: tuple[str, ...]
    sources: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    description: str = ""
    downloads: tuple[Download, ...] = ()


def _downloads(spec: Any, at: str) -> tuple[Download, ...]:
    if not isinstance(spec, list) or not all(isinstance(d, dict) for d in spec):
        raise VariantError(f"{at}: a list of recipes, each {{url: https://..., sha256: ..., dest: /opt/NAME, strip: N}}")
    out: list[Download] = []
    for i, d in enumerate(spec):
        here = f"{at}[{i}]"
        unknown = sorted(set(map(str, d)) - DOWNLOAD_KEYS)
        if unknown:
            raise VariantError(f"{here}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(DOWNLOAD_KEYS))}")
        url, sha, dest, strip = d.get("url"), d.get("sha256"), d.get("dest"), d.get("strip", 0)
        if not isinstance(url, str) or not URL_RE.match(url):
            raise VariantError(f"{here}.url: an https URL without credentials, spaces or quotes, not {url!r}")
        if not isinstance(sha, str) or not SHA256_RE.match(sha):
            raise VariantError(f"{here}.sha256: the SHA-256 of what {url} serves (64 lower-case hex digits) is "
                               "required: a toolchain without a checksum is not built (`sha256sum FILE` of a "
                               "download you checked)")
        if not isinstance(dest, str) or not DEST_RE.match(dest):
            raise VariantError(f"{here}.dest: a directory of its own under /opt (e.g. /opt/node-22), not {dest!r}")
        if isinstance(strip, bool) or not isinstance(strip, int) or not 0 <= strip <= 5:
            raise VariantError(f"{here}.strip: how many leading path components to drop (0 to 5)")
        out.append(Download(url, sha, dest, strip))
    dests = [d.dest for d in out]
    if len(set(dests)) != len(dests):
        raise VariantError(f"{at}: two recipes unpack into one directory")
    return tuple(out)


def parse_declared(doc: Any, where: str = "kooi_runner_images") -> dict[str, Variant]:
    """The variants of the inventory's declaration DOC (a mapping of name to settings)."""
    if not isinstance(doc, dict):
        raise VariantError(f"{where}: a mapping of variant name to its settings, not {type(doc).__name__}")
    out: dict[str, Variant] = {}
    for name, spec in doc.items():
        at = f"{where}.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name) or name in RESERVED:
            raise VariantError(f"{where}: {name!r} is not a variant name (lower-case letters, digits and -, "
                               f"starting with a letter, at most 31; not {', '.join(sorted(RESERVED))})")
        if not isinstance(spec, dict):
            raise VariantError(f"{at}: a mapping with packages (and sources, environment, description)")
        unknown = sorted(set(map(str, spec)) - KEYS)
        if unknown:
            raise VariantError(f"{at}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(KEYS))}")
        downloads = _downloads(spec["downloads"], f"{at}.downloads") if "downloads" in spec else ()
        packages = spec.get("packages", [] if downloads else None)
        if not isinstance(packages, list) or not (packages or downloads) \
                or not all(isinstance(p, str) for p in packages):
            raise VariantError(f"{at}.packages: a non-empty list of Debian package names (or, for a toolchain "
                               "Debian does not package, downloads)")
        bad = [p for p in packages if not PACKAGE_RE.match(p)]
        if bad:
            raise VariantError(f"{at}.packages: {bad[0]!r} is not a Debian package name (no versions here: "
                               "kooi pins them in the lock)")
        sources = spec.get("sources", [])
        if not isinstance(sources, list) or not all(isinstance(s, str) and SOURCE_RE.match(s) for s in sources):
            raise VariantError(f"{at}.sources: a list of one-line apt sources, e.g. "
                               "'deb http://deb.debian.org/debian trixie-backports main'")
        env = spec.get("environment", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_RE.match(k) and isinstance(v, str)
                                                and ENV_VALUE_RE.match(v) for k, v in env.items()):
            raise VariantError(f"{at}.environment: a mapping of variable names to one-line strings of printable "
                               "ASCII without $, \\, \" or ` (the image gets them literally)")
        desc = spec.get("description", "")
        if not isinstance(desc, str):
            raise VariantError(f"{at}.description: a string")
        out[name] = Variant(name, tuple(dict.fromkeys(packages)), tuple(dict.fromkeys(sources)), dict(env), desc,
                            downloads)
    return out


def load_lock(path: Path) -> dict[str, dict[str, Any]]:
    """The variants' lock at PATH: name -> {sources: [...], packages: {name: version}};
    none where the file does not exist yet."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise VariantError(f"{path}: cannot read the variants' lock: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA or not isinstance(raw.get("variants", {}), dict):
        raise VariantError(f"{path}: not a kooi variants lock (schema {SCHEMA}, variants: a mapping)")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in (raw.get("variants") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("packages"), dict) \
                or not isinstance(entry.get("sources", []), list):
            raise VariantError(f"{path}: variants.{name}: sources (a list) and packages (name: version)")
        sources = [str(s) for s in entry.get("sources", [])]
        packages = {str(k): str(v) for k, v in entry["packages"].items()}
        bad = [f"{k}={v}" for k, v in packages.items() if not PACKAGE_RE.match(k) or not VERSION_RE.match(v)] \
            + [s for s in sources if not SOURCE_RE.match(s)]
        if bad:
            raise VariantError(f"{path}: variants.{name}: {bad[0]!r} is not a Debian package and version or an apt "
                               "source line; fix or delete the entry (kooi pins it again)")
        out[str(name)] = {"sources": sources, "packages": packages}
    return out


def dump_lock(pins: dict[str, dict[str, Any]]) -> str:
    head = ("# kooi runner image variants lock (kooi_runner_images): the Debian version of every\n"
            "# package each variant adds, and the apt sources it was resolved from. Written by kooi\n"
            "# (site.yml's preflight pins a new package; delete a variant's entry to resolve it\n"
            "# again); commit it with the inventory.\n")
    body = {"schema": SCHEMA, "variants": {n: {"sources": list(p["sources"]),
                                               "packages": dict(sorted(p["packages"].items()))}
                                           for n, p in sorted(pins.items())}}
    return "---\n" + head + yaml.dump(body, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class _Dumper(yaml.SafeDumper):
    """Lists indented under their key (yamllint's default style)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def unpinned(variants: dict[str, Variant], pins: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Per variant, its packages the lock does not pin (all of them where its sources
    changed: a pin is only good for the sources it came from)."""
    out: dict[str, list[str]] = {}
    for name, v in variants.items():
        entry = pins.get(name)
        if entry is None or list(entry["sources"]) != list(v.sources):
            if v.packages:  # a variant of downloads alone reads no package index
                out[name] = list(v.packages)
        else:
            missing = [p for p in v.packages if p not in entry["packages"]]
            if missing:
                out[name] = missing
    return out


# --- the archive's package indexes ---------------------------------------------------

def index_urls(source: str, arch: str) -> list[tuple[str, str]]:
    """(URL of Packages.xz, of Packages.gz) of each component of the apt SOURCE line."""
    m = SOURCE_RE.match(source)
    if not m:
        raise VariantError(f"{source!r} is not a one-line apt source")
    uri, suite, comps = m.group(1).rstrip("/"), m.group(2), m.group(3).split()
    return [(f"{uri}/dists/{suite}/{c}/binary-{arch}/Packages.xz", f"{uri}/dists/{suite}/{c}/binary-{arch}/Packages.gz")
            for c in comps]


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as resp:
        data: bytes = resp.read(MAX_INDEX)
        return data


def read_index(source: str, arch: str, fetch: Callable[[str], bytes] = _fetch) -> dict[str, list[str]]:
    """Package name -> the versions SOURCE offers for ARCH (and for all)."""
    out: dict[str, list[str]] = {}
    for xz, gz in index_urls(source, arch):
        try:
            text = lzma.decompress(fetch(xz))
        except (OSError, lzma.LZMAError):
            try:
                text = gzip.decompress(fetch(gz))
            except OSError as exc:
                raise VariantError(f"cannot read the package index of {source!r} ({xz}: {exc})") from None
        name = ""
        for line in text.decode(errors="replace").splitlines():
            if line.startswith("Package: "):
                name = line[9:].strip()
            elif line.startswith("Version: ") and name:
                version = line[9:].strip()
                if not VERSION_RE.match(version) or not PACKAGE_RE.match(name):
                    raise VariantError(f"the package index of {source!r} names {name!r} {version!r}, not a Debian "
                                       "package and version: not used")
                out.setdefault(name, []).append(version)
    return out


def resolve(variants: dict[str, Variant], wanted: dict[str, list[str]], base_sources: Iterable[str], arch: str,
            fetch: Callable[[str], bytes] = _fetch) -> dict[str, dict[str, str]]:
    """The newest version of each WANTED package (variant -> names) in the runner lock's
    sources and the variant's; VariantError naming every variant and package the archive
    does not have."""
    indexes: dict[str, dict[str, list[str]]] = {}
    out: dict[str, dict[str, str]] = {}
    missing: list[str] = []
    for name, packages in sorted(wanted.items()):
        sources = list(dict.fromkeys([*base_sources, *variants[name].sources]))
        for s in sources:
            if s not in indexes:
                indexes[s] = read_index(s, arch, fetch)
        for p in packages:
            versions = [v for s in sources for v in indexes[s].get(p, [])]
            if not versions:
                missing.append(f"{name}: {p}")
                continue
            best = versions[0]
            for v in versions[1:]:
                if version_compare(v, best) > 0:
                    best = v
            out.setdefault(name, {})[p] = best
    if missing:
        raise VariantError("not in the archive (" + ", ".join(sorted({s for n in wanted for s in
                                                                       [*base_sources, *variants[n].sources]}))
                           + "): " + "; ".join(missing) + ". Check the names (`apt-cache policy NAME` in the "
                           "runner image), or add the suite that has them to the variant's sources")
    return out


# --- Debian version order (dpkg's) ---------------------------------------------------

def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first:
                first = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first:
            return first
    return 0


def version_compare(a: str, b: str) -> int:
    """<0, 0, >0 as Debian version A sorts before, with or after B (epoch:upstream-revision)."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
        upstream, _, rev = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), upstream, rev
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def check(declared: Any, lock_path: Path, base_lock: Path, arch: str, write: bool,
          fetch: Callable[[str], bytes] = _fetch) -> dict[str, Any]:
    """Check the declaration, pin what the lock lacks (written when WRITE), and return
    {changed, variants: {name: {sources, packages, environment, description}}} with the
    pins each build uses. Pins of variants no longer declared are dropped from the lock."""
    variants = parse_declared(declared)
    pins = load_lock(lock_path)
    wanted = unpinned(variants, pins)
    try:
        base = yaml.safe_load(base_lock.read_text())
        base_sources = list(((base or {}).get("apt") or {}).get("sources") or [])
    except (OSError, yaml.YAMLError, AttributeError, TypeError) as exc:
        raise VariantError(f"{base_lock}: cannot read the runner image lock: {exc}") from None
    if not all(isinstance(x, str) and SOURCE_RE.match(x) for x in base_sources):
        # They go into the variant's build as they are (review 50).
        raise VariantError(f"{base_lock}: apt.sources must be one-line apt sources (deb URI SUITE COMPONENT...)")
    resolved = resolve(variants, wanted, base_sources, arch, fetch) if wanted else {}
    new: dict[str, dict[str, Any]] = {}
    for name, v in variants.items():
        entry = pins.get(name)
        keep = entry["packages"] if entry is not None and entry["sources"] == list(v.sources) else {}
        new[name] = {"sources": list(v.sources),
                     "packages": {p: keep.get(p) or resolved[name][p] for p in v.packages}}
    changed = dump_lock(new) != dump_lock(pins) if (pins or new) else False
    if changed and write:
        lock_path.write_text(dump_lock(new))
    return {"changed": changed, "lock": str(lock_path),
            "variants": {n: {**new[n], "base_sources": base_sources, "environment": variants[n].environment,
                             "description": variants[n].description,
                             "downloads": [vars(d) for d in variants[n].downloads]} for n in sorted(new)}}
