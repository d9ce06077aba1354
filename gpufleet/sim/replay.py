"""Load a simulated fleet (a ``gpufleet sim`` directory) into InfluxDB, resumably.

v1: ``POST /write?db=DB&precision=ns`` with gzip bodies of ``batch`` lines (InfluxDB 1.x, and
the v1 compatibility API of 2.x/3.x). v2: influxdb-client's synchronous WriteApi. The number
of lines already written is kept in ``DIR/.replay-<target>.json`` after every batch, so an
interrupted replay continues where it stopped (``--restart`` starts over). ``speed`` paces
the batches so that data time advances ``speed`` times faster than wall time.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path

from gpufleet.errors import GpufleetError


class Replayer:
    def __init__(
        self,
        directory,
        url: str,
        api: str = "v1",
        db: str | None = None,
        bucket: str | None = None,
        org: str | None = None,
        token_file: str | None = None,
        speed: float | None = None,
        batch: int = 5000,
        create_db: bool = True,
        timeout: float = 30.0,
        retries: int = 5,
    ):
        self.dir = Path(directory)
        self.data = self.dir / "telemetry.lp.gz"
        if not self.data.is_file() or not (self.dir / "manifest.json").is_file():
            raise GpufleetError(f"{self.dir}: not a simulator output (no telemetry.lp.gz/manifest.json)")
        try:
            self.manifest = json.loads((self.dir / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise GpufleetError(f"{self.dir}/manifest.json: unreadable: {exc}") from None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise GpufleetError(f"bad --influx-url {url!r}: expected http(s)://host:port")
        self.url = url.rstrip("/")
        self.api = api
        self.speed = speed
        self.batch = int(batch)
        self.timeout = timeout
        self.retries = retries
        self.create_db = create_db
        if api == "v1":
            if not db:
                raise GpufleetError("--influx-db is required with --influx-api v1")
            self.db = db
            self.target = f"database {db}"
        elif api == "v2":
            if not bucket or not org or not token_file:
                raise GpufleetError("--influx-bucket, --influx-org and --influx-token-file are required "
                                    "with --influx-api v2")
            from gpufleet.secrets import read_secret

            self.token = read_secret("--influx-token", token_file)
            self.bucket, self.org = bucket, org
            self.target = f"bucket {bucket}"
        else:
            raise GpufleetError(f"unknown --influx-api {api!r} (v1 or v2)")
        key = hashlib.sha256(f"{api}|{self.url}|{db or bucket}".encode()).hexdigest()[:12]
        self.state_file = self.dir / f".replay-{key}.json"

    # -- position ---------------------------------------------------------------------------
    def position(self) -> int:
        try:
            return int(json.loads(self.state_file.read_text())["lines_done"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _save(self, done: int) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"target": f"{self.url} {self.target}", "lines_done": done}) + "\n")
            tmp.replace(self.state_file)
        except OSError:
            pass  # a read-only data directory replays fine, it only cannot resume

    # -- writing ----------------------------------------------------------------------------
    def _open_v1(self):
        import requests

        self.session = requests.Session()
        try:
            r = self.session.get(self.url + "/ping", timeout=self.timeout)
        except requests.RequestException as exc:
            raise GpufleetError(f"cannot reach InfluxDB at {self.url}: {type(exc).__name__}") from None
        if r.status_code not in (200, 204):
            raise GpufleetError(f"{self.url}/ping answered {r.status_code}: not an InfluxDB v1 API")
        if self.create_db:
            r = self.session.post(
                self.url + "/query", params={"q": f'CREATE DATABASE "{self.db}"'}, timeout=self.timeout
            )
            if r.status_code >= 400:
                raise GpufleetError(
                    f"CREATE DATABASE {self.db} failed: {r.status_code} {r.text.strip()[:200]}"
                )

    def _write_v1(self, body: bytes) -> None:
        import requests

        data = gzip.compress(body, compresslevel=1, mtime=0)
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                r = self.session.post(
                    self.url + "/write",
                    params={"db": self.db, "precision": "ns"},
                    data=data,
                    headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"},
                    timeout=self.timeout,
                )
            except requests.RequestException as exc:
                if attempt == self.retries:
                    raise GpufleetError(f"cannot write to {self.url}: {type(exc).__name__}") from None
            else:
                if r.status_code == 204:
                    return
                if r.status_code == 404:
                    raise GpufleetError(f"{self.url}: database {self.db} does not exist (use --create-db)")
                if r.status_code < 500 and r.status_code != 429:
                    raise GpufleetError(
                        f"{self.url} rejected a batch: {r.status_code} {r.text.strip()[:200]}"
                    )
                if attempt == self.retries:
                    raise GpufleetError(f"{self.url} keeps failing: {r.status_code} {r.text.strip()[:200]}")
            time.sleep(delay)
            delay = min(delay * 2, 10)

    def _open_v2(self):
        try:
            from influxdb_client import InfluxDBClient
            from influxdb_client.client.write_api import SYNCHRONOUS
        except ImportError:
            raise GpufleetError(
                "--influx-api v2 needs influxdb-client (pip install 'gpufleet[agent]')"
            ) from None
        self.client = InfluxDBClient(
            url=self.url, token=self.token, org=self.org, timeout=int(self.timeout * 1000)
        )
        self.write_api = self.client.write_api(write_options=SYNCHRONOUS)

    def _write_v2(self, body: bytes) -> None:
        from influxdb_client.rest import ApiException

        try:
            self.write_api.write(bucket=self.bucket, org=self.org, record=body, write_precision="ns")
        except ApiException as exc:
            raise GpufleetError(f"{self.url} rejected a batch: {exc.status} {str(exc.body)[:200]}") from None
        except Exception as exc:  # urllib3 connection errors and the like
            raise GpufleetError(f"cannot write to {self.url}: {type(exc).__name__}") from None

    def run(self, restart: bool = False, progress: bool | None = None) -> int:
        """Write every line not yet written; return how many this call wrote."""
        skip = 0 if restart else self.position()
        total = sum(self.manifest.get("telemetry", {}).get("lines", {}).values()) or None
        if self.api == "v1":
            self._open_v1()
            write = self._write_v1
        else:
            self._open_v2()
            write = self._write_v2
        bar = None
        if progress is None or progress:
            from tqdm import tqdm

            bar = tqdm(
                total=total,
                initial=skip,
                unit="line",
                desc=f"replay -> {self.target}",
                disable=None if progress is None else False,
            )
        done = skip
        written = 0
        wall0 = data0 = None
        buf: list[bytes] = []
        try:
            with gzip.open(self.data, "rb") as f:
                for i, line in enumerate(f):
                    if i < skip or not line.strip():
                        continue
                    buf.append(line)
                    if len(buf) >= self.batch:
                        wall0, data0 = self._pace(buf, wall0, data0)
                        write(b"".join(buf))
                        done += len(buf)
                        written += len(buf)
                        self._save(done)
                        if bar:
                            bar.update(len(buf))
                        buf = []
                if buf:
                    self._pace(buf, wall0, data0)
                    write(b"".join(buf))
                    done += len(buf)
                    written += len(buf)
                    self._save(done)
                    if bar:
                        bar.update(len(buf))
        except (OSError, EOFError) as exc:
            raise GpufleetError(f"{self.data}: unreadable: {exc}") from None
        finally:
            if bar:
                bar.close()
            if self.api == "v2":
                self.client.close()
        return written

    def _pace(self, buf: list[bytes], wall0, data0):
        if not self.speed:
            return wall0, data0
        try:
            t_data = int(buf[-1].rsplit(b" ", 1)[1]) / 1e9
        except (ValueError, IndexError):
            return wall0, data0
        now = time.monotonic()
        if wall0 is None:
            return now, t_data
        due = wall0 + (t_data - data0) / self.speed
        if due > now:
            time.sleep(min(due - now, 60.0))
        return wall0, data0
