"""The Triton replicas one frontend sends its requests to, and which one takes each request.

``--triton-url`` names them: a comma-separated list ``host:port,host:port`` (one entry is the
single Triton of before: no health loop, no draining, every call goes to it) or gRPC's naming
scheme ``dns:///NAME:PORT`` (a Kubernetes headless Service): NAME is resolved with the event
loop's ``getaddrinfo`` (never blocking the loop), every address is a replica, and it is resolved
again every ``resolve_interval_s``; addresses that appear are added, those that vanish are retired
(no new requests; their client is closed once their last request ended).

Health (only with more than one replica, or with DNS): every ``health_interval_s`` each replica is
probed (``probe``: Triton's ``is_server_ready`` and its repository index, which gives the models
READY there). A replica that fails its probe, or whose call failed to connect
(:meth:`ReplicaSet.mark_down`, passive), is drained: it takes no new requests until a probe
passes again.

Routing (:meth:`ReplicaSet.pick`): among the healthy replicas whose last probe listed the model
READY, the one with the fewest outstanding requests (ties: round robin). When no healthy replica
lists the model, any healthy replica (least outstanding), so that Triton's own answer (not ready,
unknown model) reaches the caller; when none is healthy, :class:`TritonUnavailableError` (503).

This module is Triton-free: the client type, its factory and the probe are given by the caller
(``TritonEngine``), so the policy is tested with fakes (``tests/unit/test_replicas.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .errors import TritonUnavailableError

logger = logging.getLogger(__name__)

#: gRPC's naming scheme for a DNS name (``dns:///NAME:PORT``; ``dns://AUTHORITY/NAME:PORT`` too,
#: the authority is ignored: the event loop's resolver is used)
DNS_SCHEME = "dns://"
#: Test hook only (the scale-out e2e test shows its balancing check red with it): every
#: :meth:`ReplicaSet.pick` returns the replica of this index (in address order), healthy or not.
PIN_ENV = "OMNI_TRITON_PIN_REPLICA"
DEFAULT_PORT = 8001  # Triton's gRPC port

C = TypeVar("C")
#: ``(host, port) -> ["ip:port", ...]``: every address the name resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(eq=False)
class Replica(Generic[C]):
    """One Triton server.

    Attributes:
        address: ``host:port`` (``[v6]:port`` for an IPv6 address): the gRPC target, and the
            ``replica`` label of its metrics.
        client: its client (one gRPC channel), made by the set's factory on first use.
        healthy: takes new requests (False: drained, until a probe passes).
        models: the models READY there at its last probe; ``None`` before any probe (a lone
            replica is never probed: it is taken for every model).
        outstanding: requests (unary calls and streams) now in flight on it.
        requests, errors: calls started on it, and those that ended with an error (counters).
        last_error: why it was last drained ('' when never).
        retired: its address left the DNS answer (no new requests; closed once idle).
        factory: ``address -> client`` (the set's).
    """

    address: str
    factory: Callable[[str], C] = field(repr=False)
    healthy: bool = True
    models: frozenset[str] | None = None
    outstanding: int = 0
    requests: int = 0
    errors: int = 0
    last_error: str = ""
    retired: bool = False
    _client: C | None = field(default=None, repr=False)

    @property
    def client(self) -> C:
        """The replica's client, created on first use (inside the event loop that uses it:
        grpc.aio channels belong to one loop)."""
        if self._client is None:
            self._client = self.factory(self.address)
        return self._client

    @property
    def has_client(self) -> bool:
        """Whether :attr:`client` was created (and so needs closing)."""
        return self._client is not None

    def serves(self, model: str) -> bool:
        """Whether its last probe listed ``model`` READY (never probed: assumed)."""
        return self.models is None or model in self.models


def parse_target(url: str) -> tuple[list[str], tuple[str, int] | None]:
    """Split ``--triton-url`` into ``(static addresses, dns (name, port) or None)``.

    ``"a:8001,b:8001"`` -> ``(["a:8001", "b:8001"], None)``; ``"dns:///svc:8001"`` ->
    ``([], ("svc", 8001))``. A DNS target without a port takes Triton's gRPC port 8001.

    Raises:
        ValueError: an empty list, an empty entry or a DNS target without a name.
    """
    url = url.strip()
    if url.startswith(DNS_SCHEME):
        rest = url[len(DNS_SCHEME):]
        target = rest.split("/", 1)[1] if "/" in rest else rest
        host, port = _split_host_port(target)
        if not host:
            raise ValueError(f"--triton-url {url!r}: no name after {DNS_SCHEME}/")
        return [], (host, port)
    entries = [e.strip() for e in url.split(",")]
    if not url or any(not e for e in entries):
        raise ValueError(f"--triton-url {url!r}: expected host:port[,host:port...] or dns:///NAME:PORT")
    return list(dict.fromkeys(entries)), None


def _split_host_port(target: str) -> tuple[str, int]:
    """``"name:port"`` / ``"[v6]:port"`` / ``"name"`` -> ``(host, port)`` (port 8001 when absent).

    Raises ValueError on a port that is not a number."""
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif target.count(":") == 1:
        host, port = target.split(":")
    else:
        host, port = target, ""
    if port and not port.isdigit():
        raise ValueError(f"--triton-url: port {port!r} of {target!r} is not a number")
    return host, int(port) if port else DEFAULT_PORT


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def resolve_dns(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as ``ip:port``, sorted (the event loop's
    ``getaddrinfo``: run in its executor, the loop stays free). Raises ``OSError``
    (``socket.gaierror``) when the name does not resolve."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({_address(str(info[4][0]), port) for info in infos})


def pinned_index() -> int | None:
    """The replica index of ``$OMNI_TRITON_PIN_REPLICA`` (test hook), None when unset.

    Raises:
        ValueError: set but not a non-negative integer.
    """
    raw = os.environ.get(PIN_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"{PIN_ENV}={raw!r}: expected a replica index (0, 1, ...)")
    return int(raw)


class ReplicaSet(Generic[C]):
    """The replicas of one ``--triton-url`` and the policy that picks one per request.

    Args:
        url: ``--triton-url``: ``host:port[,host:port...]`` or ``dns:///NAME:PORT``
            (:func:`parse_target`; raises ``ValueError`` on a malformed one).
        factory: ``address -> client``; called on a replica's first use.
        probe: ``client -> the models READY there``; raises when the replica is not ready or
            unreachable (any exception drains it, its message is kept in ``last_error``).
        close: ``client -> awaitable`` closing a client (its channel).
        resolve_interval_s: seconds between DNS resolutions (DNS targets only).
        health_interval_s: seconds between two probe rounds (more than one replica, or DNS).
        resolver: ``(host, port) -> addresses`` (default :func:`resolve_dns`; tests inject one).
        pin: test hook (:data:`PIN_ENV`): every pick returns the replica of this index.
    """

    def __init__(self, url: str, factory: Callable[[str], C], probe: Callable[[C], Awaitable[frozenset[str]]],
                 close: Callable[[C], Awaitable[Any]], *, resolve_interval_s: float = 10.0,
                 health_interval_s: float = 1.0, resolver: Resolver | None = None, pin: int | None = None):
        static, self.dns = parse_target(url)
        self.url = url
        self._factory = factory
        self._probe = probe
        self._close = close
        self.resolve_interval_s = resolve_interval_s
        self.health_interval_s = health_interval_s
        self._resolver = resolver or resolve_dns
        self.pin = pin
        self._replicas: dict[str, Replica[C]] = {a: Replica(a, factory) for a in static}
        self._retired: list[Replica[C]] = []
        self._rr = 0
        self._started: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.resolve_error = ""

    # ------------------------------------------------------------------ state
    @property
    def replicas(self) -> list[Replica[C]]:
        """The current replicas (retired ones left out), in address order."""
        return [self._replicas[a] for a in sorted(self._replicas)]

    @property
    def checked(self) -> bool:
        """Whether replicas are probed (and drained): more than one static address, or DNS.
        A lone static replica is today's single Triton: never probed, never drained."""
        return self.dns is not None or len(self._replicas) > 1

    def healthy(self) -> list[Replica[C]]:
        """The replicas taking new requests (a lone static replica always counts)."""
        if not self.checked:
            return self.replicas
        return [r for r in self.replicas if r.healthy]

    def all_known(self) -> list[Replica[C]]:
        """Current and retired replicas (metrics keep counting a retired one until it is closed)."""
        return self.replicas + self._retired

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Resolve the DNS name and probe every replica once (checked sets only), then keep doing
        both in background tasks. Idempotent and cheap once started; concurrent callers wait for
        the same first round (a caller's cancellation does not cancel it)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._first_round())
        if not self._started.done():
            await asyncio.shield(self._started)

    async def _first_round(self) -> None:
        if self.dns is not None:
            await self.resolve()
        if not self.checked:
            return
        await self.check()
        if self.dns is not None:
            self._tasks.append(asyncio.create_task(self._every(self.resolve_interval_s, self.resolve)))
        self._tasks.append(asyncio.create_task(self._every(self.health_interval_s, self.check)))

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except Exception:  # a bug must not end the loop silently
                logger.exception("replica set %s: %s failed", self.url, getattr(step, "__name__", step))

    async def close(self) -> None:
        """Stop the background tasks and close every client."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._started is not None and not self._started.done():
            self._started.cancel()
            await asyncio.gather(self._started, return_exceptions=True)
        self._started = None
        for replica in self.all_known():
            if replica.has_client:
                client, replica._client = replica.client, None
                await self._close(client)
        self._retired.clear()

    async def resolve(self) -> None:
        """Resolve the DNS name once: add new addresses (healthy until their first probe, which
        runs at once), retire vanished ones. A failed resolution keeps the current set."""
        if self.dns is None:
            return
        host, port = self.dns
        try:
            addresses = set(await self._resolver(host, port))
        except OSError as exc:
            self.resolve_error = f"{host}: {exc}"
            logger.warning("triton replicas: resolving %s failed (%s); keeping %d replica(s)", host, exc,
                           len(self._replicas))
            return
        self.resolve_error = "" if addresses else f"{host} resolved to no address"
        added = [a for a in sorted(addresses) if a not in self._replicas]
        for address in [a for a in self._replicas if a not in addresses]:
            replica = self._replicas.pop(address)
            replica.retired, replica.healthy = True, False
            self._retired.append(replica)
            logger.info("triton replicas: %s left %s", address, host)
        for address in added:
            self._replicas[address] = replica = Replica(address, self._factory)
            logger.info("triton replicas: %s joined %s", address, host)
            if self._started is not None and self._started.done():
                await self._check_one(replica)
        await self._close_idle_retired()

    async def _close_idle_retired(self) -> None:
        for replica in [r for r in self._retired if r.outstanding == 0]:
            self._retired.remove(replica)
            if replica.has_client:
                client, replica._client = replica.client, None
                await self._close(client)

    async def check(self) -> None:
        """Probe every replica at once: a pass makes it healthy with the models it listed, a
        failure drains it."""
        await asyncio.gather(*(self._check_one(r) for r in self.replicas))
        await self._close_idle_retired()

    async def _check_one(self, replica: Replica[C]) -> None:
        try:
            models = await self._probe(replica.client)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.mark_down(replica, f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc))
            return
        if not replica.healthy:
            logger.info("triton replica %s is back (%d models ready)", replica.address, len(models))
        replica.healthy, replica.models = True, frozenset(models)

    def mark_down(self, replica: Replica[C], why: str) -> None:
        """Drain ``replica`` (no new requests) until its next probe passes. A lone static
        replica is never drained (there is no other; its calls fail on their own)."""
        if not self.checked:
            return
        if replica.healthy:
            logger.warning("triton replica %s drained: %s", replica.address, why)
        replica.healthy, replica.last_error = False, why

    # ------------------------------------------------------------------ routing
    def pick(self, model: str | None, exclude: Collection[Replica[C]] = (), rotate: bool = True) -> Replica[C]:
        """The replica for the next request on ``model`` (None: any, e.g. a metadata call).

        Least outstanding requests among the healthy replicas that list ``model`` READY, ties
        in round robin; when none lists it, any healthy one (Triton's own error then answers);
        ``exclude``: replicas already tried by this request. ``rotate=False`` (metadata calls: a
        readiness check, a config) does not advance the round robin: otherwise a request that
        makes one metadata pick and one inference pick lands on the same replica every time (the
        scale-out e2e test saw 1/7 and 6/2 splits of sequential requests).

        Raises:
            TritonUnavailableError: no healthy replica (outside ``exclude``) is left.
        """
        replicas = self.replicas
        if self.pin is not None:
            if self.pin >= len(replicas):
                raise TritonUnavailableError(f"{PIN_ENV}={self.pin}: only {len(replicas)} Triton replica(s)")
            return replicas[self.pin]
        healthy = [r for r in self.healthy() if r not in exclude]
        if not healthy:
            raise TritonUnavailableError(self._none_healthy(exclude))
        serving = [r for r in healthy if model is None or r.serves(model)] or healthy
        fewest = min(r.outstanding for r in serving)
        ties = [r for r in serving if r.outstanding == fewest]
        if rotate:
            self._rr += 1
        return ties[self._rr % len(ties)]

    def _none_healthy(self, exclude: Collection[Replica[C]]) -> str:
        if not self._replicas:
            return f"Triton is unavailable: {self.resolve_error or self.url + ' has no replica'}"
        why = "; ".join(f"{r.address}: {r.last_error or 'unready'}" for r in self.replicas if r not in exclude)
        tried = f" ({len(exclude)} tried)" if exclude else ""
        return f"Triton is unavailable: no healthy replica{tried}" + (f" ({why})" if why else "")

    @contextlib.contextmanager
    def use(self, replica: Replica[C]) -> Iterator[Replica[C]]:
        """Count one call on ``replica`` (requests, outstanding) for its duration; an exception
        that leaves the block counts as an error (a cancellation does not)."""
        replica.requests += 1
        replica.outstanding += 1
        try:
            yield replica
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except BaseException:
            replica.errors += 1
            raise
        finally:
            replica.outstanding -= 1
