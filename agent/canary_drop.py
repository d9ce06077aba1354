"""The SDC canary's drop directory: how a check run outside the agent hands its result over.

On a busy fleet the idle windows come at job boundaries: ``gpufleet canary`` run by a Slurm
Epilog/Prolog (packaging/slurm) or a Kubernetes hook writes each result into the agent's
``canary.drop_dir`` (:func:`write_drop`), and the agent's canary collector takes them at every
tick (:class:`DropDir`) and turns each into a ``gpu_canary`` row like its own.

One result = one file ``<time_ns>-<gpu>-<pid>-<random>.json``, written to a hidden temporary name
and renamed into place (a reader never sees half a file)::

    {"version": 1, "time_ns": ..., "tags": {"gpu": ..., "uuid": ..., "model": ...},
     "fields": {"passed": 1, ...}, "source": "slurm-epilog"}

``fields`` holds ``gpu_canary`` fields only (:data:`FIELD_TYPES`), ``passed`` required; the reader
keeps the tags ``gpu``, ``uuid`` and ``model``. The reader takes each file once: it removes it, or
sets a malformed one aside as ``NAME.bad``; a file it can neither remove nor rename is left alone
and never read again by this process. A writer refuses (``OSError``, ENOSPC) once ``max_files``
results are waiting.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from gpufleet.agent.model import Sample

DROP_SUFFIX = ".json"
DROP_VERSION = 1
# gpu_canary fields a result may carry, with their types (the catalogue's)
FIELD_TYPES: dict[str, type] = {
    "passed": int, "mismatches": int, "memory_mismatches": int, "duration_seconds": float,
    "startup_seconds": float, "digest": str, "reference_match": int, "checks": int, "checks_failed": int}


def drop_sample(doc: dict) -> Sample:
    """A drop file's ``gpu_canary`` row; ValueError/TypeError/KeyError when malformed."""
    if not isinstance(doc, dict) or doc.get("version") != DROP_VERSION:
        raise ValueError(f"not a version {DROP_VERSION} canary result")
    tags = doc["tags"]
    if not isinstance(tags, dict) or not isinstance(tags.get("gpu"), str) or not tags["gpu"]:
        raise ValueError("tags.gpu missing")
    tags = {k: str(v) for k, v in tags.items() if k in ("gpu", "uuid", "model") and v}
    raw = doc["fields"]
    if not isinstance(raw, dict):
        raise TypeError("fields is not an object")
    fields = {}
    for k, v in raw.items():
        typ = FIELD_TYPES.get(k)
        if typ is None:
            raise ValueError(f"unknown field {k!r}")
        if typ is str and not isinstance(v, str):
            raise TypeError(f"{k} is not a string")
        if typ is not str and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise TypeError(f"{k} is not a number")
        fields[k] = typ(v)
    if "passed" not in fields:
        raise ValueError("fields.passed missing")
    t = int(doc["time_ns"])
    if t <= 0:
        raise ValueError("time_ns is not positive")
    return Sample("gpu_canary", tags, fields, t, extra={"source": str(doc.get("source", "drop"))})


def write_drop(drop_dir: str | os.PathLike, sample: Sample, source: str, max_files: int = 1000) -> Path:
    """Write one result into the drop directory, atomically (temp file + rename). OSError when
    the directory is full (``max_files`` results waiting, or the disk) or not writable."""
    d = Path(drop_dir)
    d.mkdir(parents=True, exist_ok=True)
    waiting = sum(1 for n in os.listdir(d) if n.endswith(DROP_SUFFIX))
    if waiting >= max_files:
        import errno

        raise OSError(errno.ENOSPC, f"drop directory full ({waiting} results waiting)")
    doc = {"version": DROP_VERSION, "time_ns": sample.time_ns, "tags": sample.tags,
           "fields": sample.fields, "source": source}
    name = f"{sample.time_ns}-{sample.tags.get('gpu', 'x')}-{os.getpid()}-{os.urandom(3).hex()}{DROP_SUFFIX}"
    tmp = d / f".{name}.tmp"
    try:
        tmp.write_text(json.dumps(doc))
        os.chmod(tmp, 0o644)
        tmp.replace(d / name)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return d / name


class DropDir:
    """The reading side: the results waiting in one drop directory, each taken once.

    ``files`` counts the results taken, ``errors`` the problems (a directory that cannot be
    listed, a malformed file, one that cannot be removed); each problem is one warning on
    ``log`` (the caller's logger), a directory that cannot be listed once per distinct reason."""

    def __init__(self, path: str | os.PathLike, log: logging.Logger):
        self.path = Path(path)
        self.log = log
        self.files = self.errors = 0
        self._skip: set[str] = set()  # files that could not be removed or set aside
        self._logged = ""
        try:  # the agent's own directory: it must be able to remove what hooks leave there
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # not there and not creatable: nothing to take until a hook creates it

    def take(self, limit: int = 256) -> list[Sample]:
        """The results waiting (at most ``limit``, in name order) as ``gpu_canary`` rows; each file
        is removed once read, or set aside as ``NAME.bad`` when malformed."""
        d = self.path
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(DROP_SUFFIX) and n not in self._skip)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.errors += 1
            why = str(exc.strerror or exc)
            if why != self._logged:  # one line per distinct problem, not one per tick
                self._logged = why
                self.log.warning("canary drop_dir %s: %s", d, why)
            return []
        out = []
        for name in names[:limit]:
            p = d / name
            try:
                doc = json.loads(p.read_bytes())
                s = drop_sample(doc)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                self.errors += 1
                self.log.warning("canary drop file %s: malformed (%s); set aside as .bad", p, exc)
                try:
                    p.rename(p.with_name(name + ".bad"))
                except OSError:
                    self._skip.add(name)  # never read twice
                continue
            try:
                p.unlink()
            except OSError as exc:
                self.errors += 1
                self._skip.add(name)  # read once: never again
                self.log.warning("canary drop file %s: cannot remove (%s); left alone", p,
                                 exc.strerror or exc)
            self.files += 1
            out.append(s)
        return out
