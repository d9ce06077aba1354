"""The SDC canary's check, run in a short-lived child process: ``PYTHON -P .../agent/canary_worker.py``.

Run as a script, by any interpreter that has numpy and the engine (``canary.python``): it imports
nothing of gpufleet. ``-P`` keeps its own folder off the import path.

One run = one check on one device: import the engine (torch, cupy, or numpy on the CPU), build
seeded inputs on the device, run one GEMM and a memory pattern check (write, read back:
0x55.., 0xAA.., the element's own index), compare the GEMM result bit for bit with this
device's first answer (kept as ``<state_dir>/<sha1(label|key)[:16]>.npz``; the first run
stores it), print ONE JSON object on stdout and exit. The CUDA context (and the clocks it
pins, the host memory torch takes) dies with the process: the agent never imports torch, cupy
or a CUDA library itself (:mod:`gpufleet.agent.canary_child` starts this module and reads its line).

The device: the parent restricts the child with ``CUDA_VISIBLE_DEVICES=<uuid>`` (and
``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so the check runs on CUDA device 0 and touches no other GPU.

Output (one line of JSON, exit 0 also when the check found corruption)::

    {"ok": true, "engine": "torch", "version": "torch-2.5-cuda-12.4", "model": "NVIDIA H100 ...",
     "key": "<model>|<driver>|<version>|<dtype>|n<size>|seed<seed>", "digest": "<sha256>",
     "mismatches": 0, "memory_mismatches": 0, "first": "created" | "compared",
     "duration_seconds": 0.21, "timing": {"import_s", "context_s", "gemm_s", "mem_s", "wall_s"}}

or ``{"ok": false, "error": "...", "reason": "no_engine" | "failed" | "usage"}`` (exit 3, 2 for
usage). ``mismatches`` counts result elements that differ from the first answer (all of them
when the shapes differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time

_T_START = time.perf_counter()
_PATTERNS = (0x55555555, 0xAAAAAAAA)


# ------------------------------------------------------------------------------------ engines
class NumpyEngine:
    """The CPU: float32 GEMM through numpy's BLAS."""

    name = "numpy"

    def __init__(self):
        import numpy as np

        self.np = np
        # (exact inputs, see gemm: answers stored from the earlier, rounded ones are not compared)
        self.version = f"numpy-{np.__version__}-exact"

    def model(self) -> str:
        return platform.processor() or platform.machine()

    def context(self) -> None:
        pass

    def gemm(self, n: int, dtype: str, seed: int):
        np = self.np
        if dtype != "float32":
            raise ValueError(f"the numpy engine runs float32, not {dtype}")
        # Small integers: every product and partial sum is exact in float32 (|sum| <= 64 n, at
        # most 2**21 at the largest size, 32768, inside float32's 2**24), so the result's bits do
        # not depend on the order the BLAS sums in. With normal inputs they did: its kernel and
        # thread count follow the CPUs the process may use and OPENBLAS_CORETYPE, so the agent's
        # check and a Slurm epilog's (one CPU, a bare environment) got different bits of one
        # product: a corruption that was not.
        rng = np.random.Generator(np.random.PCG64(seed))
        a = rng.integers(-8, 9, (n, n)).astype(np.float32)
        b = rng.integers(-8, 9, (n, n)).astype(np.float32)
        return a @ b

    def flip_bits(self, out, count: int, bit: int) -> None:
        np = self.np
        raw = out.reshape(-1).view(np.uint32)
        idx = np.linspace(0, raw.size - 1, num=count, dtype=np.int64)
        raw[idx] ^= np.uint32(1 << bit)

    def host(self, out):
        return self.np.ascontiguousarray(out)

    def memcheck(self, nbytes: int) -> int:
        np = self.np
        buf = np.empty(max(1, nbytes // 4), dtype=np.uint32)
        bad = 0
        for p in _PATTERNS:
            buf.fill(p)
            bad += int(np.count_nonzero(buf != np.uint32(p)))
        buf[:] = np.arange(buf.size, dtype=np.uint32)
        bad += int(np.count_nonzero(buf != np.arange(buf.size, dtype=np.uint32)))
        return bad

    def sync(self) -> None:
        pass


class TorchEngine:
    """CUDA device 0 (the one GPU the parent left visible) through torch; Philox inputs."""

    name = "torch"

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device")
        self.torch = torch
        self.device = "cuda:0"
        self.version = f"torch-{torch.__version__}-cuda-{torch.version.cuda}"

    def model(self) -> str:
        return self.torch.cuda.get_device_properties(0).name

    def context(self) -> None:
        self.torch.zeros(1, device=self.device)
        self.torch.cuda.synchronize(0)

    def gemm(self, n: int, dtype: str, seed: int):
        t = self.torch
        g = t.Generator(device=self.device).manual_seed(seed)
        dt = getattr(t, dtype)
        a = t.randn((n, n), generator=g, device=self.device, dtype=t.float32).to(dt)
        b = t.randn((n, n), generator=g, device=self.device, dtype=t.float32).to(dt)
        out = a @ b
        del a, b
        return out

    def flip_bits(self, out, count: int, bit: int) -> None:
        t = self.torch
        width = 8 * out.element_size()
        view = out.view(t.int16 if width == 16 else t.int32).reshape(-1)
        idx = t.linspace(0, view.numel() - 1, steps=count, device=out.device).long()
        bit = bit % width
        mask = (1 << bit) if bit < width - 1 else -(1 << (width - 1))  # the sign bit, as a signed int
        view[idx] = view[idx] ^ mask

    def host(self, out):
        t = self.torch
        return out.view(t.int16 if out.element_size() == 2 else t.int32).cpu().numpy()

    def memcheck(self, nbytes: int) -> int:
        t = self.torch
        n = max(1, nbytes // 4)
        buf = t.empty(n, dtype=t.int32, device=self.device)
        bad = 0
        for p in _PATTERNS:
            v = p - (1 << 32) if p >= 1 << 31 else p
            buf.fill_(v)
            bad += int((buf != v).sum().item())
        ref = t.arange(n, dtype=t.int32, device=self.device)
        buf.copy_(ref)
        bad += int((buf != ref).sum().item())
        del buf, ref
        return bad

    def sync(self) -> None:
        self.torch.cuda.synchronize(0)


class CupyEngine:
    """CUDA device 0 through cupy; XORWOW inputs."""

    name = "cupy"

    def __init__(self):
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("cupy sees no CUDA device")
        self.cp = cupy
        self.version = f"cupy-{cupy.__version__}"

    def model(self) -> str:
        name = self.cp.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def context(self) -> None:
        self.cp.cuda.Device(0).use()
        self.cp.zeros(1)
        self.sync()

    def gemm(self, n: int, dtype: str, seed: int):
        cp = self.cp
        if dtype not in ("float32", "float16"):
            raise ValueError(f"the cupy engine runs float32 or float16, not {dtype}")
        rng = cp.random.Generator(cp.random.XORWOW(seed))
        a = rng.standard_normal((n, n), dtype=cp.float32).astype(dtype)
        b = rng.standard_normal((n, n), dtype=cp.float32).astype(dtype)
        return a @ b

    def flip_bits(self, out, count: int, bit: int) -> None:
        cp = self.cp
        raw = out.reshape(-1).view(cp.uint16 if out.itemsize == 2 else cp.uint32)
        idx = cp.linspace(0, raw.size - 1, num=count).astype(cp.int64)
        raw[idx] ^= raw.dtype.type(1 << bit)

    def host(self, out):
        return self.cp.asnumpy(out)

    def memcheck(self, nbytes: int) -> int:
        cp = self.cp
        n = max(1, nbytes // 4)
        buf = cp.empty(n, dtype=cp.uint32)
        bad = 0
        for p in _PATTERNS:
            buf.fill(p)
            bad += int(cp.count_nonzero(buf != cp.uint32(p)))
        ref = cp.arange(n, dtype=cp.uint32)
        buf[:] = ref
        bad += int(cp.count_nonzero(buf != ref))
        return bad

    def sync(self) -> None:
        self.cp.cuda.Device(0).synchronize()


ENGINES = {"numpy": NumpyEngine, "torch": TorchEngine, "cupy": CupyEngine}
ENGINE_NAMES = ("auto", *ENGINES)
DEFAULT_DTYPE = {"torch": "bfloat16", "cupy": "float32", "numpy": "float32"}


class NoEngine(RuntimeError):
    """The requested engine cannot run here (not installed, or no CUDA device)."""


def make_engine(name: str):
    """``auto``: torch with CUDA, else cupy, else NoEngine (a GPU check never falls back to the
    CPU silently); ``numpy``: the CPU."""
    if name == "auto":
        why = []
        for cls in (TorchEngine, CupyEngine):
            try:
                return cls()
            except (ImportError, RuntimeError, OSError) as exc:
                why.append(f"{cls.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        raise NoEngine("no CUDA engine (" + "; ".join(why) + ")")
    try:
        return ENGINES[name]()
    except (ImportError, RuntimeError, OSError) as exc:
        raise NoEngine(f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def reference_key(model: str, driver: str, version: str, dtype: str, size: int, seed: int) -> str:
    """Fleet reference key: the same key gives the same answer on a healthy device."""
    return f"{model.replace(' ', '_')}|{driver}|{version}|{dtype}|n{size}|seed{seed}"


def first_path(state_dir: str, label: str, key: str) -> str:
    return os.path.join(state_dir, hashlib.sha1(f"{label}|{key}".encode()).hexdigest()[:16] + ".npz")


def check(engine: str, size: int, dtype: str, seed: int, memory_bytes: int, state_dir: str,
          label: str, driver: str, inject: tuple[int, int] | None = None) -> dict:
    """One check in this process; raises NoEngine / ValueError."""
    t0 = time.perf_counter()
    import numpy as np

    eng = make_engine(engine)
    t1 = time.perf_counter()
    eng.context()
    t2 = time.perf_counter()
    dtype = dtype or DEFAULT_DTYPE[eng.name]
    out = eng.gemm(size, dtype, seed)
    if inject is not None:
        eng.flip_bits(out, *inject)
    eng.sync()
    t3 = time.perf_counter()
    mem_bad = eng.memcheck(memory_bytes) if memory_bytes > 0 else 0
    eng.sync()
    t4 = time.perf_counter()
    host = eng.host(out)
    del out
    t5 = time.perf_counter()
    digest = hashlib.sha256(host.tobytes()).hexdigest()
    model = eng.model()
    key = reference_key(model, driver, eng.version, dtype, size, seed)
    res = {"ok": True, "engine": eng.name, "version": eng.version, "model": model, "key": key,
           "dtype": dtype, "size": size, "digest": digest, "memory_mismatches": int(mem_bad)}
    path = first_path(state_dir, label, key) if state_dir else ""
    first = None
    if path and os.path.isfile(path):
        try:
            with np.load(path, allow_pickle=False) as z:
                first = (str(z["digest"]), z["result"])
        except (OSError, ValueError, KeyError):
            first = None  # unreadable: replaced by this answer
    if first is None:
        res["first"] = "created"
        res["mismatches"] = 0
        if path:
            os.makedirs(state_dir, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp.npz"
            np.savez(tmp, digest=np.array(digest), result=host)
            os.replace(tmp, path)
    else:
        fd, fh = first
        res["first"] = "compared"
        if fh.shape == host.shape and fh.dtype.itemsize == host.dtype.itemsize:
            w = f"u{fh.itemsize}"
            res["mismatches"] = int(np.count_nonzero(fh.reshape(-1).view(w) != host.reshape(-1).view(w)))
        else:
            res["mismatches"] = int(host.size)
        if res["mismatches"] == 0 and fd != digest:
            res["mismatches"] = int(host.size)
    res["duration_seconds"] = t5 - t2
    res["timing"] = {"import_s": t1 - t0, "context_s": t2 - t1, "gemm_s": t3 - t2, "mem_s": t4 - t3,
                     "wall_s": time.perf_counter() - _T_START}
    return res


def _inject(text: str) -> tuple[int, int]:
    count, _, bit = text.partition(":")
    return int(count), int(bit or 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="canary_worker.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--engine", default="auto", choices=ENGINE_NAMES)
    p.add_argument("--size", type=int, default=0)
    p.add_argument("--dtype", default="")
    p.add_argument("--seed", type=int, default=20261126)
    p.add_argument("--memory-bytes", type=int, default=-1)
    p.add_argument("--state-dir", default="")
    p.add_argument("--label", default="0")
    p.add_argument("--driver", default="unknown")
    p.add_argument("--inject", type=_inject, default=None, help="COUNT:BIT flip bits after the GEMM (drills)")
    try:
        a = p.parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            print(json.dumps({"ok": False, "reason": "usage", "error": "bad arguments"}), flush=True)
        return int(exc.code or 0)
    gpu = a.engine != "numpy"
    size = a.size or (4096 if gpu else 256)
    mem = a.memory_bytes if a.memory_bytes >= 0 else ((256 << 20) if gpu else (8 << 20))
    try:
        res = check(a.engine, size, a.dtype, a.seed, mem, a.state_dir, a.label, a.driver, a.inject)
    except NoEngine as exc:
        res = {"ok": False, "reason": "no_engine", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - any failure is the result, as one JSON line
        why = " ".join(str(exc).split())
        res = {"ok": False, "reason": "failed", "error": f"{type(exc).__name__}: {why}"[:300]}
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
