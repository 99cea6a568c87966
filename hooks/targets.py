"""Where a webhook may be sent: a URL's host canonicalised, resolved, and every address checked.

A webhook URL is chosen by an agent, and the worker that sends it sits inside the deployment's network: a URL aimed
inward (loopback, a private network, the cloud metadata service) would turn the worker into a proxy for whoever holds
a token. So the host is read the way browsers and curl read it before anything is decided:

- lower case, one trailing dot dropped (``localhost.`` is ``localhost``), Unicode mapped and IDNA-encoded (nameprep:
  full-width letters spelling ``localhost`` are ``localhost``, full-width digits and the ideographic full stop
  spelling ``127.0.0.1`` are ``127.0.0.1``);
- IPv4 in every spelling ``inet_aton`` accepts: ``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``;
- IPv6 that carries an IPv4 address: IPv4-mapped (``::ffff:127.0.0.1`` and ``::ffff:7f00:1``), IPv4-compatible
  (``::127.0.0.1``), 6to4 (``2002:7f00:1::``), Teredo, NAT64 (``64:ff9b::7f00:1``): the IPv4 inside is checked too.

An address is refused unless it is globally routable: loopback, private, link-local (the metadata service at
169.254.169.254), shared (CGNAT, 100.64.0.0/10), multicast, reserved, unspecified (``0.0.0.0``, ``::``), documentation
and the other special-purpose ranges, and whatever RECKON_WEBHOOK_DENY_NETWORKS adds. RECKON_WEBHOOK_ALLOW_NETWORKS
(empty by default) opens ranges that are not global — a receiver beside Reckon in a demo or a test — but never the
unspecified, multicast or broadcast addresses nor the metadata services.

A name is resolved when the subscription is made (an address refused then refuses the subscription) and again at
every delivery, where every address it resolves to is checked and the connection is made to the checked address
itself (``pinned``): nothing resolves the name a second time between the check and the connect, so a DNS server that
answers differently the second time (DNS rebinding) gets nothing sent. ``resolve`` is the one place names are
resolved: tests replace it with a stub."""

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never, whatever RECKON_WEBHOOK_ALLOW_NETWORKS says: the cloud metadata services (AWS/GCP/Azure over IPv4, AWS over
# IPv6, Alibaba) and the broadcast address.
METADATA = (
    ipaddress.ip_network("169.254.169.254/32"),
    ipaddress.ip_network("fd00:ec2::254/128"),
    ipaddress.ip_network("100.100.100.200/32"),
)
BROADCAST = ipaddress.ip_network("255.255.255.255/32")
CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
# Names that are loopback by definition (RFC 6761), whatever a resolver says.
LOOPBACK_NAMES = re.compile(r"(^|\.)localhost$")
ASCII_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$")


class TargetRefused(ValueError):
    """The URL's host is not one deliveries may go to; the message says why, naming the address."""


@dataclass(frozen=True)
class Host:
    """A URL's host as it is connected to: ``name`` (ASCII, lower case, no trailing dot: what Host and SNI carry)
    and, for an address literal, ``address``."""

    name: str
    address: Address | None = None

    @property
    def netloc_host(self) -> str:
        return f"[{self.name}]" if isinstance(self.address, ipaddress.IPv6Address) else self.name


Resolver = Callable[[str, int], list[str]]


def system_resolve(name: str, port: int) -> list[str]:
    """The addresses ``name`` resolves to (getaddrinfo, TCP), as text, in the order to try them."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


# The resolver used for registration and delivery; tests replace it (monkeypatch hooks.targets.resolve).
resolve: Resolver = system_resolve


# --- the host, canonical ------------------------------------------------------------------------------------------


def canonical_host(hostname: str) -> Host:
    """``hostname`` (as urlsplit gives it: no brackets, lower case) read as browsers and curl read it. Raises
    TargetRefused for a host that is not a valid name or address."""
    if not hostname:
        raise TargetRefused("a webhook URL has a host")
    if ":" in hostname:  # an IPv6 literal (it was in brackets)
        if "%" in hostname:
            raise TargetRefused("a webhook URL's IPv6 address carries no zone (%…)")
        try:
            v6 = ipaddress.IPv6Address(hostname)
        except ValueError:
            raise TargetRefused(f"not an IPv6 address: {hostname[:100]}") from None
        inner = v6.ipv4_mapped or _compatible(v6)
        if inner is not None:  # only a spelling of an IPv4 address
            return Host(str(inner), inner)
        return Host(str(v6), v6)
    if "%" in hostname:
        raise TargetRefused("a webhook URL's host is not percent-encoded")
    name = hostname
    if not name.isascii():
        try:
            # The standard library's IDNA (nameprep: NFKC and case folding), the one socket.getaddrinfo itself applies
            # to a Unicode name: the name checked and resolved here is the name the system would have resolved.
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise TargetRefused(f"not a valid host name (IDNA): {hostname[:100]}") from None
    name = name.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > 253:
        raise TargetRefused("a webhook URL's host name is 1 to 253 characters")
    v4 = _loose_ipv4(name)
    if v4 is not None:
        return Host(str(v4), v4)
    if not ASCII_NAME.match(name):
        raise TargetRefused(f"not a valid host name: {hostname[:100]}")
    return Host(name)


def _compatible(v6: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address of an IPv4-compatible IPv6 address (``::a.b.c.d``, deprecated); not of ``::`` or ``::1``."""
    if v6 in IPV4_COMPATIBLE and int(v6) > 1:
        return ipaddress.IPv4Address(int(v6) & 0xFFFFFFFF)
    return None


def _loose_ipv4(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host that ends in a number spells, in inet_aton's (and the URL standard's) reading: one to
    four parts, each decimal, octal (leading 0) or hexadecimal (0x), the last filling the remaining bytes. None for a
    name that does not end in a number; TargetRefused for one that does but is no address (``1.2.3.256``)."""
    parts = name.split(".")
    if not re.fullmatch(r"[0-9]+|0[xX][0-9a-fA-F]*", parts[-1]):
        return None
    if len(parts) > 4:
        raise TargetRefused(f"not an IPv4 address: {name[:100]}")
    numbers = []
    for part in parts:
        if re.fullmatch(r"0[xX][0-9a-fA-F]*", part):
            numbers.append(int(part[2:] or "0", 16))
        elif re.fullmatch(r"0[0-7]+", part):
            numbers.append(int(part, 8))
        elif re.fullmatch(r"0|[1-9][0-9]*", part):
            numbers.append(int(part))
        else:
            raise TargetRefused(f"not an IPv4 address: {name[:100]}")
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        raise TargetRefused(f"not an IPv4 address: {name[:100]}")
    value = last + sum(n << (8 * (3 - i)) for i, n in enumerate(head))
    return ipaddress.IPv4Address(value)


# --- an address, allowed or not -----------------------------------------------------------------------------------


def networks(text: str) -> list[Network]:
    return [ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip()]


def embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, 6to4, Teredo's server and client, NAT64)."""
    if isinstance(address, ipaddress.IPv4Address):
        return []
    found = [address.ipv4_mapped, _compatible(address), address.sixtofour]
    if address.teredo is not None:
        found.extend(address.teredo)
    if address in NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [a for a in found if a is not None]


def _kind(address: Address) -> str:
    """Why an address is not globally routable ("" if it is)."""
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in CGNAT:
        return "a shared (CGNAT) address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_V6:
        return "not a global unicast IPv6 address"
    if not address.is_global:
        return "not a globally routable address"
    return ""


def refusal(address: Address, *, allow: Iterable[Network] = (), deny: Iterable[Network] = ()) -> str:
    """Why a delivery must not go to ``address`` ("" when it may). Every IPv4 address it carries is checked as well."""
    allow, deny = list(allow), list(deny)
    carried = embedded_ipv4(address)
    for candidate in (address, *carried):
        spelled = f"{address} (it carries {candidate})" if candidate != address else str(address)
        if any(candidate in network for network in METADATA):
            return f"{spelled} is a cloud metadata service"
        if candidate in BROADCAST:
            return f"{spelled} is the broadcast address"
        if candidate.is_multicast or candidate.is_unspecified:
            return f"{spelled} is {_kind(candidate)}"
        if any(candidate in network for network in deny if candidate.version == network.version):
            return f"{spelled} is in RECKON_WEBHOOK_DENY_NETWORKS"
        kind = _kind(candidate)
        # A 6to4 or NAT64 address is judged by the IPv4 address it carries (checked next).
        if (
            candidate == address
            and carried
            and isinstance(address, ipaddress.IPv6Address)
            and (address in NAT64 or address.sixtofour is not None)
        ):
            continue
        if kind and not any(candidate in network for network in allow if candidate.version == network.version):
            return f"{spelled} is {kind}"
    return ""


def configured_refusal(address: Address) -> str:
    return refusal(
        address,
        allow=networks(settings.RECKON_WEBHOOK_ALLOW_NETWORKS),
        deny=networks(settings.RECKON_WEBHOOK_DENY_NETWORKS),
    )


def name_refusal(host: Host) -> str:
    """For a name that is loopback by definition (``localhost``, ``*.localhost``): why it is refused, as 127.0.0.1
    would be (an allowed loopback lets it through to resolution)."""
    if host.address is None and LOOPBACK_NAMES.search(host.name):
        loopback = configured_refusal(ipaddress.IPv4Address("127.0.0.1"))
        if loopback:
            return f"{host.name} is a loopback name"
    return ""


# --- resolving and pinning ----------------------------------------------------------------------------------------


class Unresolved(OSError):
    """The name does not resolve (now): a delivery is tried again later."""


def pinned_addresses(host: Host, port: int, resolver: Resolver | None = None) -> list[Address]:
    """The addresses to connect to for ``host``, every one checked: its literal, or every address its name resolves
    to. TargetRefused if any is refused (a name with one address inward is refused whole); Unresolved if none."""
    if host.address is not None:
        addresses: list[Address] = [host.address]
    else:
        why = name_refusal(host)
        if why:
            raise TargetRefused(why)
        try:
            answers = (resolver or resolve)(host.name, port)
        except (OSError, UnicodeError) as failure:
            raise Unresolved(f"{host.name} does not resolve: {failure}") from None
        addresses = []
        for text in answers:
            try:
                address = ipaddress.ip_address(text.split("%")[0])
            except ValueError:
                raise TargetRefused(f"{host.name} resolves to {text[:60]!r}, not an address") from None
            inner = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
            addresses.append(inner or address)
        if not addresses:
            raise Unresolved(f"{host.name} resolves to no address")
    for address in addresses:
        why = configured_refusal(address)
        if why:
            raise TargetRefused(why if host.address is not None else f"{why} ({host.name} resolves to it)")
    return addresses
