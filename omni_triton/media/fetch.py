"""Fetching http(s) media URLs of chat content parts (``image_url`` / ``video_url``) for the
frontend, under a :class:`UrlFetchPolicy`: off unless hosts are allow-listed; every hop (the URL
and each redirect, followed by hand) must name an allowed host and resolve only to public
addresses (no private, loopback, link-local, reserved, multicast or unspecified IPs unless a
network is explicitly trusted); size and whole-fetch time limits. Each refusal is a
:class:`UrlFetchError` with its own 4xx status and code. httpx (async), no torch.

Known limit: the addresses are checked from this process's own resolution just before the
connection; a DNS server answering differently between the check and httpx's own lookup (DNS
rebinding with a zero TTL) is not excluded. Deployments that need that should pin the egress
(a proxy or network policy) as well.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

#: Resolver: host, port -> IP address strings (default: the event loop's getaddrinfo)
Resolver = Callable[[str, int], Awaitable[list[str]]]


class UrlFetchError(Exception):
    """A media URL was refused or could not be fetched: ``status`` (HTTP 4xx for the client),
    ``code`` (OpenAI-style error code), ``message``."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class UrlFetchPolicy:
    """What the frontend may fetch.

    ``allowed_hosts``: host names (lower-case, exact) or ``*.domain`` suffix patterns; empty:
    http(s) URLs are refused (400 ``url_input_disabled``). ``max_bytes``: body limit (413).
    ``timeout_s``: the whole fetch, redirects included (408). ``max_redirects`` (400 beyond).
    ``trusted_networks``: CIDRs accepted although not public (an internal media server).
    """

    allowed_hosts: frozenset[str] = frozenset()
    max_bytes: int = 8 * 1024 * 1024
    timeout_s: float = 10.0
    max_redirects: int = 3
    trusted_networks: tuple[str, ...] = field(default=())

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_hosts)

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for pattern in self.allowed_hosts:
            p = pattern.lower().rstrip(".")
            if host == p or (p.startswith("*.") and host.endswith(p[1:])):
                return True
        return False

    def address_allowed(self, address: str) -> bool:
        """Public (``is_global``, not multicast) or inside a trusted network."""
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if any(ip in ipaddress.ip_network(n, strict=False) for n in self.trusted_networks):
            return True
        return ip.is_global and not ip.is_multicast


async def _resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


async def _check_hop(url: str, policy: UrlFetchPolicy, resolve: Resolver) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UrlFetchError(400, "invalid_url", f"media URL scheme {parts.scheme!r}: only http(s) and data URLs")
    if parts.username or parts.password:
        raise UrlFetchError(400, "invalid_url", "media URLs with credentials are not accepted")
    host = parts.hostname
    if not host:
        raise UrlFetchError(400, "invalid_url", f"media URL {url!r} has no host")
    if not policy.host_allowed(host):
        raise UrlFetchError(403, "url_host_not_allowed", f"media URL host {host!r} is not in the allowed hosts")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = await resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise UrlFetchError(400, "url_fetch_failed", f"media URL host {host!r} does not resolve ({exc})") from None
    if not addresses:
        raise UrlFetchError(400, "url_fetch_failed", f"media URL host {host!r} does not resolve")
    bad = [a for a in addresses if not policy.address_allowed(a)]
    if bad:
        raise UrlFetchError(403, "url_private_address",
                            f"media URL host {host!r} resolves to a non-public address ({', '.join(bad)})")


async def fetch_url(url: str, policy: UrlFetchPolicy, resolve: Resolver | None = None,
                    transport=None) -> tuple[str, bytes]:
    """GET ``url`` under ``policy``; returns ``(content type without parameters, body bytes)``.

    Redirects (301/302/303/307/308) are followed by hand, each hop checked as the first.
    ``resolve`` / ``transport`` (an ``httpx.AsyncBaseTransport``) are for tests.

    Raises:
        UrlFetchError: 400 ``url_input_disabled`` / ``invalid_url`` / ``too_many_redirects`` /
            ``url_fetch_failed`` (connection error, non-200 answer); 403 ``url_host_not_allowed``
            / ``url_private_address``; 413 ``url_too_large``; 408 ``url_timeout``.
    """
    import httpx

    if not policy.enabled:
        raise UrlFetchError(400, "url_input_disabled",
                            "http(s) media URLs are not enabled on this server; send a base64 data URL")
    resolve = resolve or _resolve

    async def run() -> tuple[str, bytes]:
        current = url
        async with httpx.AsyncClient(follow_redirects=False, transport=transport, trust_env=False,
                                     timeout=policy.timeout_s) as client:
            for _hop in range(policy.max_redirects + 1):
                await _check_hop(current, policy, resolve)
                async with client.stream("GET", current) as resp:
                    if resp.status_code in (301, 302, 303, 307, 308):
                        location = resp.headers.get("location")
                        if not location:
                            raise UrlFetchError(400, "url_fetch_failed", "media URL redirect without a Location")
                        current = urljoin(current, location)
                        continue
                    if resp.status_code != 200:
                        raise UrlFetchError(400, "url_fetch_failed",
                                            f"media URL answered HTTP {resp.status_code}")
                    length = resp.headers.get("content-length")
                    if length and length.isdigit() and int(length) > policy.max_bytes:
                        raise UrlFetchError(413, "url_too_large",
                                            f"media URL body of {length} bytes is over the limit of {policy.max_bytes}")
                    body = bytearray()
                    async for chunk in resp.aiter_bytes():
                        body += chunk
                        if len(body) > policy.max_bytes:
                            raise UrlFetchError(413, "url_too_large",
                                                f"media URL body is over the limit of {policy.max_bytes} bytes")
                    mime = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                    return mime, bytes(body)
        raise UrlFetchError(400, "too_many_redirects", f"media URL redirected more than {policy.max_redirects} times")

    try:
        return await asyncio.wait_for(run(), policy.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        raise UrlFetchError(408, "url_timeout", f"media URL fetch took longer than {policy.timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise UrlFetchError(400, "url_fetch_failed", f"media URL fetch failed ({type(exc).__name__})") from None
