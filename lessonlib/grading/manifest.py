"""The manifest of a grading run: what was written and graded, signed with the instructor's key.

:func:`write_results` writes the score table, its details and the manifest
(SHA-256 of both CSV files and of every graded submission, with an
HMAC-SHA256 over all of it); :func:`verify` checks them later and says what
that guarantees. The key (:func:`load_key`) lives outside the results folder,
in the instructor's configuration folder by default, and is made on the first
grading run.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
from pathlib import Path
from typing import Sequence

from .results import NotebookResult, csv_bytes, details_rows, safe_text, score_table


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def manifest_path(csv_path: Path | str) -> Path:
    """Where the signed manifest of the grades CSV at ``csv_path`` is written: beside it, ``<name>-manifest.json``."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + "-manifest.json")


# --------------------------------------------------------------------------
# The key that signs the manifest: kept outside the results folder
# --------------------------------------------------------------------------

KEY_ENV = "LESSONLIB_GRADING_KEY"


def default_key_path() -> Path:
    """Where the instructor's grading key lives: ``$LESSONLIB_GRADING_KEY``, else
    ``$XDG_CONFIG_HOME/lessonlib/grading.key`` (``~/.config/lessonlib/grading.key``)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "lessonlib" / "grading.key"


def load_key(path: Path | str | None = None, *, create: bool = False) -> bytes:
    """The grading key (32 random bytes, hex in a file readable by its owner only).

    ``create=True`` makes one when there is none (the first grading run);
    otherwise a missing key is a ``FileNotFoundError`` that names the file.
    """
    path = Path(path) if path is not None else default_key_path()
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"no grading key at {path} (grading makes one; pass --key to use another)") from None
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise ValueError(f"key {path} is not a grading key (64 hex digits)")
    return bytes.fromhex(text)


def _signature(manifest: dict, key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != "hmac"}
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"lessonlib grading key id\0" + key).hexdigest()[:16]


def write_results(results: Sequence[NotebookResult], csv_path: Path | str, *, key: bytes | None = None,
                  key_path: Path | str | None = None) -> dict:
    """Write the score table, its details and a signed manifest, each atomically; return the manifest.

    ``grades.csv`` (one row per student), ``grades-details.csv`` (one row per
    file and question) and ``grades-manifest.json``: the SHA-256 of both CSV
    files and of every graded submission, and an HMAC-SHA256 of all of it
    with ``key`` (default: :func:`load_key` at ``key_path``, made on first
    use). The key must not lie in the results folder. :func:`verify` checks
    them later.
    """
    import lessonlib

    csv_path = Path(csv_path)
    if key is None:
        kp = Path(key_path) if key_path is not None else default_key_path()
        if kp.resolve().parent == csv_path.resolve().parent:
            raise ValueError(f"key_path {kp} lies in the results folder: anyone who can edit the results "
                             f"could sign them; keep the key elsewhere")
        key = load_key(kp, create=True)
    if not isinstance(key, bytes) or len(key) < 16:
        raise ValueError("key must be at least 16 bytes")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    details = csv_path.with_name(csv_path.stem + "-details.csv")
    table = csv_bytes(*score_table(results))
    detail = csv_bytes(*details_rows(results))
    manifest = {
        "files": {csv_path.name: hashlib.sha256(table).hexdigest(),
                  details.name: hashlib.sha256(detail).hexdigest()},
        "submissions": {safe_text(r.path): r.sha256 for r in results if r.path},
        "students": len({r.student for r in results}),
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lessonlib": lessonlib.__version__,
        "key_id": _key_id(key),
    }
    manifest["hmac"] = _signature(manifest, key)
    _atomic_write(csv_path, table)
    _atomic_write(details, detail)
    _atomic_write(manifest_path(csv_path), (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return manifest


def _sha256_of(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(csv_path: Path | str, *, key: bytes | None = None, key_path: Path | str | None = None,
           submissions: Path | str | None = None) -> list[str]:
    """What differs from what the grader wrote (an empty list: nothing).

    What an empty list guarantees:

    1. the manifest was written by someone holding the key (its HMAC-SHA256
       matches), so it was not edited, nor made up, by anyone without the key;
    2. ``grades.csv`` and ``grades-details.csv`` are byte for byte the files
       the manifest lists;
    3. with ``submissions`` (the folder that was graded): every graded
       notebook is still byte for byte the one that was graded, and no
       notebook was added since.

    It does not say the grades are right (that is the grading), and it
    proves nothing against someone who holds the key: keep it outside the
    results folder, readable by you only.
    """
    from .submission import find_submissions

    csv_path = Path(csv_path)
    try:
        manifest = json.loads(manifest_path(csv_path).read_text())
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return [f"no readable manifest beside {csv_path.name}: {exc}"]
    if key is None:
        try:
            key = load_key(key_path)
        except (OSError, ValueError) as exc:
            return [f"cannot check the manifest's signature: {exc}"]
    problems = []
    if manifest.get("key_id") not in (None, _key_id(key)):
        problems.append("the manifest was signed with another key (pass the key used for grading with --key)")
    elif not hmac.compare_digest(str(manifest.get("hmac", "")), _signature(manifest, key)):
        problems.append("the manifest's signature does not match: it was changed, or written without the key")
    for name, digest in (manifest.get("files") or {}).items():
        p = csv_path.with_name(str(name))
        if not p.exists():
            problems.append(f"{name} is missing")
        elif _sha256_of(p) != digest:
            problems.append(f"{name} was changed after grading (SHA-256 differs from the manifest)")
    if submissions is not None:
        stored = manifest.get("submissions") or {}
        found = {safe_text(s.rel): s.path for s in find_submissions(submissions)}
        for rel, digest in sorted(stored.items()):
            if rel not in found:
                problems.append(f"submission {rel} is missing from {submissions}")
            elif digest and _sha256_of(found[rel]) != digest:
                problems.append(f"submission {rel} changed after grading (SHA-256 differs from the manifest)")
        problems += [f"submission {rel} was not graded (added after grading?)" for rel in sorted(set(found) - set(stored))]
    return problems


