"""A running Flower SuperLink's Control API, as ldpfl's coordinator uses it: submit a run, watch it, stop it.

This is what Flower's own commands do (``flwr run``: build the app bundle, a FAB, and ``StartRun`` with
the run configuration as overrides; ``flwr ls``: ``ListRuns``; ``flwr stop``: ``StopRun``), over Flower's
own client (``flwr.supercore.control.ControlHttpClient``, one HTTP port for the Control API in Flower
1.41), in this process, so that every failure is one line naming the SuperLink and the likely cause:
an address that does not resolve or refuses connections, a TLS failure, a server that is no Flower
SuperLink, or a SuperLink that refuses the request. The app bundle holds only the ``pyproject.toml`` of
:func:`~.protocol.app_pyproject`; its components are modules of the installed ldpfl.

Imports flwr and httpx inside the functions that talk to a SuperLink; :func:`parse_superlink` needs neither.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ldpfl.common.errors import ParameterError

from .launch import FlowerRunError
from .protocol import APP_NAME, PUBLISHER, app_pyproject

ACTIVE = ("pending", "starting", "running")  # a run's status before "finished"
APP_ID = f"{PUBLISHER}/{APP_NAME}"  # the fab_id of ldpfl's app on a SuperLink
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


class SuperLinkError(FlowerRunError):
    """The SuperLink cannot be reached, fails TLS, is none, refuses or is busy; the message is one line."""


def parse_superlink(text: str) -> str:
    """Return ``text`` as a ``HOST:PORT`` address (a name, an IPv4 address or a bracketed IPv6 address).

    Raises
    ------
    ParameterError
        Naming ``superlink``: a scheme, no port, a port outside 1-65535, or a malformed host.
    """
    value = str(text).strip()
    host, colon, port = value.rpartition(":")
    if "://" in value:
        problem = "takes no scheme (give HOST:PORT, e.g. coordinator.example:9093)"
    elif not colon or not port.isdigit():
        problem = "needs a port (HOST:PORT, e.g. coordinator.example:9093 or 127.0.0.1:9093)"
    elif not 1 <= int(port) <= 65535:
        problem = f"has port {port}, outside 1-65535"
    elif not _HOST.match(host):
        problem = "has no valid host (a name, an IPv4 address or an [IPv6] address)"
    else:
        return f"{host}:{int(port)}"
    raise ParameterError(f"`superlink` {text!r} {problem}")


@dataclass(frozen=True)
class RunState:
    """A run on the SuperLink: its id, app (``publisher/name``), status, sub-status and failure details."""

    run_id: int
    app: str
    status: str
    sub_status: str
    details: str

    @property
    def active(self) -> bool:
        """Whether the run has not finished (pending, starting or running)."""
        return self.status in ACTIVE

    def describe(self) -> str:
        """Return ``run N (app A, status S)``."""
        return f"run {self.run_id} (app {self.app or 'unknown'}, {self.status})"


def _tls_failure(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "[SSL" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _flower_error_message(text: str) -> str | None:
    from flwr.supercore.error.base import FlowerError

    try:
        error = FlowerError.from_json(text)
    except Exception:  # noqa: BLE001 - any other body: not a Flower error
        return None
    if error is None:
        return None
    return " ".join(part for part in (error.message, getattr(error, "public_details", "") or "") if part)


class ControlClient:
    """A connection to a SuperLink's Control API (``HOST:PORT``): TLS by default, system CAs unless given.

    Parameters
    ----------
    address : str
        ``HOST:PORT`` of the SuperLink (:func:`parse_superlink`).
    insecure : bool
        No TLS (tests on 127.0.0.1 only: the run configuration travels in clear).
    root_certificates : path, optional
        PEM file of the CA that signed the SuperLink's certificate (default: the system's CAs).
    timeout : float
        Seconds each request may take.
    """

    def __init__(self, address: str, *, insecure: bool = False, root_certificates: str | os.PathLike[str] | None = None,
                 timeout: float = 30.0):
        from flwr.supercore.control import ControlHttpClient

        if insecure and root_certificates is not None:
            raise ParameterError("`insecure` and `root_certificates` exclude each other (no TLS, or TLS with that "
                                 "CA)")
        self.address = parse_superlink(address)
        self.insecure = insecure
        verify: ssl.SSLContext | bool = not insecure
        if root_certificates is not None:
            verify = ssl.create_default_context()
            try:
                verify.load_verify_locations(cafile=str(root_certificates))
            except (OSError, ssl.SSLError) as error:
                raise ParameterError(f"`root_certificates` {str(root_certificates)!r} is no readable PEM certificate "
                                     f"file ({' '.join(str(error).split())})") from None
        self._client = ControlHttpClient(f"{'http' if insecure else 'https'}://{self.address}",
                                         interceptors=[_VersionHeaders()], verify=verify, timeout=timeout)

    def __enter__(self) -> ControlClient:
        """Return the client."""
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Close the connection."""
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def _call(self, method: str, request: Any) -> Any:
        import httpx

        where = f"the SuperLink at {self.address}"
        try:
            return getattr(self._client, method)(request)
        except SuperLinkError:
            raise
        except httpx.TimeoutException:
            raise SuperLinkError(f"{where} did not answer within the time limit") from None
        except httpx.HTTPStatusError as error:
            response = error.response
            message = _flower_error_message(response.text)
            if message is not None:
                raise SuperLinkError(f"{where} refused the request: {' '.join(message.split())}") from None
            if response.status_code == httpx.codes.UNAUTHORIZED:
                raise SuperLinkError(f"{where} requires account authentication (flwr login)") from None
            raise SuperLinkError(f"{self.address} answered HTTP {response.status_code} {response.reason_phrase}: it "
                                 "is not a Flower 1.41 SuperLink (check the host and the port)") from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
            raise SuperLinkError(self._connect_failure(error)) from None
        except httpx.HTTPError as error:
            raise SuperLinkError(f"cannot talk to {where}: {' '.join(str(error).split())}") from None
        except ValueError as error:  # a body that is no Control API reply
            raise SuperLinkError(f"{self.address} does not answer as a Flower SuperLink ({error})") from None

    def _connect_failure(self, error: BaseException) -> str:
        text = " ".join(str(error).split())
        where = f"the SuperLink at {self.address}"
        if _tls_failure(error):
            if self.insecure:
                return f"{self.address} speaks TLS, not plain HTTP ({text}): drop --insecure"
            if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
                return (f"TLS with {where} failed ({text}): it answers without TLS (a SuperLink started with "
                        "--insecure; for tests, --insecure here)")
            return (f"TLS with {where} failed ({text}): give the CA that signed its certificate with "
                    "--root-certificates, and an address that the certificate names")
        if "refused" in text.lower():
            return f"cannot reach {where}: connection refused (is flower-superlink running there, on that port?)"
        if "name or service not known" in text.lower() or "nodename nor servname" in text.lower() or \
                "name resolution" in text.lower():
            return f"cannot reach {where}: the host name does not resolve"
        if self.insecure and "disconnected" in text.lower():
            return (f"{where} closed the connection without an answer ({text}): a SuperLink with TLS needs TLS "
                    "here (--root-certificates, or the system's CAs), not --insecure")
        return f"cannot reach {where}: {text}"

    def runs(self) -> list[RunState]:
        """Return every run the SuperLink knows (``flwr ls``)."""
        from flwr.proto.control_pb2 import ListRunsRequest

        reply = self._call("ListRuns", ListRunsRequest())
        return [_state(run) for run in reply.run_dict.values()]

    def run(self, run_id: int) -> RunState | None:
        """Return run ``run_id``'s state, or ``None`` when the SuperLink does not know it."""
        from flwr.proto.control_pb2 import ListRunsRequest

        reply = self._call("ListRuns", ListRunsRequest(run_id=int(run_id)))
        run = reply.run_dict.get(int(run_id))
        return None if run is None else _state(run)

    def start(self, values: Mapping[str, Any], version: str) -> int:
        """Submit ldpfl's app (version ``version``) with run configuration ``values``; return the run id."""
        from flwr.cli.build import build_fab_from_files
        from flwr.common.serde import fab_to_proto, user_config_to_proto
        from flwr.proto.control_pb2 import StartRunRequest
        from flwr.supercore.fab import Fab

        with warnings.catch_warnings():  # pathspec, inside Flower's builder, warns of its own deprecations
            warnings.simplefilter("ignore", DeprecationWarning)
            fab, _ = build_fab_from_files({"pyproject.toml": app_pyproject(version).encode()})
        request = StartRunRequest(fab=fab_to_proto(Fab(hashlib.sha256(fab).hexdigest(), fab, {})),
                                  override_config=user_config_to_proto(dict(values)))
        reply = self._call("StartRun", request)
        if not reply.HasField("run_id"):
            raise SuperLinkError(f"the SuperLink at {self.address} did not start the run"
                                 + (f": {reply.note}" if reply.HasField("note") else ""))
        return int(reply.run_id)

    def stop(self, run_id: int) -> None:
        """Stop run ``run_id`` (``flwr stop``); a run that has already finished is left as it is."""
        from flwr.proto.control_pb2 import StopRunRequest

        state = self.run(run_id)
        if state is not None and state.active:
            try:
                self._call("StopRun", StopRunRequest(run_id=int(run_id)))
            except SuperLinkError:
                state = self.run(run_id)
                if state is not None and state.active:
                    raise


def _state(run: Any) -> RunState:
    return RunState(int(run.run_id), str(run.fab_id), str(run.status.status), str(run.status.sub_status),
                    " ".join(str(run.status.details).split()))


class _VersionHeaders:
    """Flower's runtime-version headers, as ``flwr`` sends them; an incompatible SuperLink is a one-line error.

    (Flower's own ``RuntimeVersionHttpInterceptor`` exits the process on an incompatible SuperLink.)
    """

    def __init__(self) -> None:
        from flwr.supercore.runtime_version_compatibility import RuntimeVersionMetadata

        self._headers = dict(RuntimeVersionMetadata.from_local_component("flwr CLI").as_metadata())

    def intercept(self, context: Any, call_next: Any) -> Any:
        """Add the headers; turn an incompatibility answer into :class:`SuperLinkError`."""
        from flwr.supercore.runtime_version_compatibility import get_runtime_version_incompatibility_exit_message

        context.request.headers.update(self._headers)
        response = call_next(context)
        if response.is_error:
            response.read()
            message = get_runtime_version_incompatibility_exit_message(response.text)
            if message:
                raise SuperLinkError(f"the SuperLink's Flower version does not work with this one: "
                                     f"{' '.join(str(message).split())}")
        return response


__all__ = ["ACTIVE", "APP_ID", "ControlClient", "RunState", "SuperLinkError", "parse_superlink"]
