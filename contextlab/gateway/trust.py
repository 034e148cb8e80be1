"""What a staff member may point the gateway at, from the admin.

Staff who are not superusers configure upstream providers. Two settings of a
provider would otherwise let them reach past the application:

- ``base_url``: a link-local or cloud-metadata address (``169.254.169.254``,
  ``fd00:ec2::254``, ``metadata.google.internal``) hands the server's cloud
  credentials to whoever reads the replies. Refused unless the operator sets
  ``CONTEXTLAB_ALLOW_LINK_LOCAL_UPSTREAMS``;
- ``api_key_env``: any server variable (``SECRET_KEY``, ``DATABASE_URL``) would
  be sent as a bearer token to that URL. Only variables named
  ``CONTEXTLAB_UPSTREAM_*`` may be named, which the operator sets for this purpose.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from django.conf import settings

API_KEY_ENV_PREFIX = "CONTEXTLAB_UPSTREAM_"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")

# Names of instance-metadata services, whatever they resolve to from here.
METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.com", "instance-data",
    "instance-data.ec2.internal", "metadata.tencentyun.com", "metadata.platformequinix.com",
})
# Addresses of metadata services outside the link-local ranges.
METADATA_ADDRESSES = frozenset({
    ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
})


def api_key_env_problem(name: str) -> str | None:
    """Why ``name`` may not be an upstream's key variable, or None when it may."""
    if not name:
        return None
    if not _ENV_NAME.match(name) or not name.startswith(API_KEY_ENV_PREFIX) or name == API_KEY_ENV_PREFIX:
        return (f"name a variable that starts with {API_KEY_ENV_PREFIX} (for example "
                f"{API_KEY_ENV_PREFIX}OPENAI_KEY), set by the operator for this provider: other server "
                "variables are not provider keys")
    return None


def _forbidden_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_link_local or address in METADATA_ADDRESSES


def base_url_problem(url: str, *, resolve: bool = True) -> str | None:
    """Why the gateway may not call ``url`` (a link-local or metadata host), or None when it may.

    With ``resolve``, a host name is also looked up: a name that points at a
    metadata address is refused like the address. A name that does not resolve
    here is allowed (the check is about where it would lead, and it leads nowhere).
    """
    if getattr(settings, "CONTEXTLAB_ALLOW_LINK_LOCAL_UPSTREAMS", False):
        return None
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    refusal = (f"{host} is a link-local or cloud-metadata address, which an upstream provider may not be "
               "(the operator can allow it with CONTEXTLAB_ALLOW_LINK_LOCAL_UPSTREAMS)")
    if not host:
        return None
    if host in METADATA_HOSTS:
        return refusal
    try:
        return refusal if _forbidden_address(ipaddress.ip_address(host.split("%", 1)[0])) else None
    except ValueError:
        pass  # a name
    if not resolve:
        return None
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    for *_, sockaddr in found:
        try:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        except ValueError:
            continue
        if _forbidden_address(address):
            return refusal
    return None
