"""Helpers of the Flower tests: Flower's daemons on 127.0.0.1, TLS files, and the check that none is left behind.

Two independent checks that a test left no process behind:

* the fixture ``marked`` / :func:`leftovers`: every process a test starts inherits an environment variable with
  a token; afterwards no running process may carry it (psutil reads the environments; this finds processes that
  Flower started in their own session and that were re-parented away from the test);
* :class:`Descendants`: psutil's tree of the test process's children, sampled while the test runs;
  afterwards none of the processes seen may still run (psutil compares creation times, so a reused pid
  does not count).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from ldpfl.contract.plan import PLAN_FILE

TOKEN_VARIABLE = "LDPFL_FLOWER_TEST_TOKEN"


@pytest.fixture(name="marked")
def marked_fixture(monkeypatch) -> str:
    """Mark every process this test starts (through the environment they inherit) to find leftovers."""
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(TOKEN_VARIABLE, token)
    return token


def tagged(variable: str, value: str) -> list[int]:
    """Live (not zombie) processes, other than this one, whose environment has ``variable=value`` (psutil)."""
    found = []
    for process in psutil.process_iter():
        try:
            if (process.pid != os.getpid() and process.status() != psutil.STATUS_ZOMBIE
                    and process.environ().get(variable) == value):
                found.append(process.pid)
        except psutil.Error:  # gone, or not ours to read
            continue
    return sorted(found)


def leftovers(token: str, settle: float = 10.0) -> list[int]:
    """Live processes, other than this one, whose environment carries ``token``, after up to ``settle`` s."""
    deadline = time.monotonic() + settle
    while (found := tagged(TOKEN_VARIABLE, token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


class Descendants:
    """psutil's children of this process (recursively), sampled every ``interval`` s until :meth:`stop`.

    Children that already ran when it was made (an earlier test's worker pool, multiprocessing's resource
    tracker) are not the test's and are left out.
    """

    def __init__(self, interval: float = 0.5):
        self.before = {self._key(child) for child in psutil.Process().children(recursive=True)} - {None}
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, args=(interval,), daemon=True)
        self._thread.start()

    @staticmethod
    def _key(process: psutil.Process) -> tuple[int, float] | None:
        try:
            return process.pid, process.create_time()
        except psutil.Error:
            return None

    def sample(self) -> None:
        """Record the children now (those that are new since this watch was made)."""
        for child in psutil.Process().children(recursive=True):
            key = self._key(child)
            if key is not None and key not in self.before:
                self.seen.setdefault(key, child)

    def _sample_until_stopped(self, interval: float) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(interval)

    def stop(self) -> None:
        """Stop sampling (after one last sample)."""
        self._stop.set()
        self._thread.join()
        self.sample()

    def running(self, settle: float = 10.0) -> list[str]:
        """Return ``pid name`` of every process seen that still runs (not a zombie) after ``settle`` s."""
        def alive() -> list[str]:
            found = []
            for process in self.seen.values():
                with contextlib.suppress(psutil.Error):
                    if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                        found.append(f"{process.pid} {process.name()}")
            return found

        deadline = time.monotonic() + settle
        while (found := alive()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return found


@contextlib.contextmanager
def superlink_with_silos(work: Path, files: Sequence[Path], *, state_dirs: Sequence[Path] | None = None,
                         extra: Sequence[str] = ()) -> Iterator[tuple[int, list]]:
    """Start a SuperLink (insecure, 127.0.0.1, a free port) and one SuperNode per file; stop them all after.

    Yields the SuperLink's port and the daemons (SuperLink first). The SuperNode of ``files[i]`` checks that
    the file is client ``i`` and keeps its resume state in ``state_dirs[i]``.
    """
    from ldpfl.stage2_federate.flower_engine.launch import start_superlink, start_supernode
    from ldpfl.stage2_federate.flower_engine.processes import stop_all

    daemons: list = []
    try:
        link, port = start_superlink(work, extra=extra, timeout=180)
        daemons.append(link)
        for index, path in enumerate(files):
            daemons.append(start_supernode(work, f"127.0.0.1:{port}", path, index=index,
                                           state_dir=None if state_dirs is None else state_dirs[index]))
        yield port, daemons
    finally:
        left = stop_all(daemons)
    assert left == [], f"processes of Flower's daemons still run: {left}"


def tls_files(directory: Path) -> dict[str, Path]:
    """Write a CA and a certificate for 127.0.0.1 signed by it, and a second, unrelated CA; return their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def certificate(name: str, key, issuer_name: str, issuer_key, *, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    paths = {}
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("ca", "other_ca", "server")}
    certs = {"ca": certificate("ldpfl test CA", keys["ca"], "ldpfl test CA", keys["ca"], ca=True),
             "other_ca": certificate("another CA", keys["other_ca"], "another CA", keys["other_ca"], ca=True),
             "server": certificate("127.0.0.1", keys["server"], "ldpfl test CA", keys["ca"], ca=False)}
    for name, cert in certs.items():
        paths[name] = directory / f"{name}.pem"
        paths[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["server_key"] = directory / "server.key"
    paths["server_key"].write_bytes(keys["server"].private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module", name="flower")
def flower_fixture() -> None:
    """Skip without Flower; import its Control API client once, quietly (its typer import warns about click 9)."""
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import flwr.supercore.control  # noqa: F401


# A short seeded federation of two silos (write_run's) through a SuperLink.
DEPLOYMENT_FLAGS = ["--rounds", "3", "--hidden", "16", "--device", "cpu", "--seed", "1", "--perturbation", "gaussian",
                    "--client-epsilons", "4,8", "--aggregation", "weighted", "--drop-per-round", "0"]


def one_line(result, code: int) -> str:
    """Assert exit ``code`` and a whole output of one ``Error:`` line; return it."""
    output = result.output if hasattr(result, "output") else result.stdout + result.stderr
    returncode = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert returncode == code, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in output, output
    return lines[0]


def coordinator_copy(run_dir: Path, to: Path) -> Path:
    """A coordinator's run directory: the manifest (and plan) of ``run_dir``, no client file."""
    to.mkdir(parents=True)
    for name in ("manifest.json", PLAN_FILE):
        if (run_dir / name).is_file():
            shutil.copy(run_dir / name, to / name)
    return to
