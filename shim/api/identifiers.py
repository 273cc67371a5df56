"""Name rules: containerd's for namespaces and sandbox ids (protocol.md, section 7), and the
limits CRI and Kubernetes put on a pod's hostname, labels and annotations.

The pod limits are checked wherever a PodSandboxConfig is validated (the shim's CreateSandbox
options and the pod layer's configs), so podshimctl, the Controller and the CRI daemon all get
them: what the Kubernetes API server would never have let through is refused here too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shim.rpc.status import InvalidArgument

__all__ = ["MAX_ANNOTATIONS_BYTES", "MAX_CRI_LABEL_VALUE_CHARS", "MAX_HOSTNAME_CHARS", "MAX_IDENTIFIER_CHARS",
           "MAX_LABEL_VALUE_CHARS",
           "is_identifier", "validate_annotations", "validate_hostname", "validate_identifier", "validate_labels"]

MAX_IDENTIFIER_CHARS = 76
_IDENTIFIER = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")

#: The kernel's HOST_NAME_MAX; kubelet's limit too for a hostname that is the pod's FQDN.
MAX_HOSTNAME_CHARS = 64
#: apimachinery's LabelValueMaxLength (and the name part of a qualified name).
MAX_LABEL_VALUE_CHARS = 63
#: A CRI label value's: kubelet's ``io.kubernetes.pod.name`` is the pod's name, a DNS-1123
#: subdomain of up to 253 characters, not an API label value of up to 63.
MAX_CRI_LABEL_VALUE_CHARS = 253
#: apimachinery's TotalAnnotationSizeLimitB: keys and values together, in bytes.
MAX_ANNOTATIONS_BYTES = 256 * 1024
_MAX_PREFIX_CHARS = 253  # a DNS-1123 subdomain
# The patterns below are compiled at their first use (re's cache), not at import: a shim starts
# without them (issue #15).
# RFC 1123 (2.1) host names: labels of letters, digits and '-' (not first or last), 1-63 each.
_HOSTNAME = r"[A-Za-z0-9](?:[-A-Za-z0-9]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*"
# apimachinery's qualifiedNameFmt (a label value may also be empty) and DNS-1123 subdomain.
_NAME = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"


def is_identifier(value: str) -> bool:
    """Whether ``value`` is a valid identifier (:func:`validate_identifier`, without the error)."""
    return 0 < len(value) <= MAX_IDENTIFIER_CHARS and _IDENTIFIER.fullmatch(value) is not None


def validate_identifier(kind: str, value: Any) -> str:
    """Return ``value`` if it is a valid identifier, else raise InvalidArgument.

    Letters and digits, joined by single ``.``, ``_`` or ``-``; 1 to 76 characters. Such a
    name is safe as one path component: it can never be ``..`` or contain ``/``.
    """
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{kind} must be a non-empty string")
    if len(value) > MAX_IDENTIFIER_CHARS:
        raise InvalidArgument(
            f"{kind} {value[:20]!r}... is {len(value)} characters; at most {MAX_IDENTIFIER_CHARS} are allowed")
    if not _IDENTIFIER.fullmatch(value):
        raise InvalidArgument(f"{kind} {value!r} is not valid: use letters and digits joined by single '.', '_' or '-'")
    return value


def validate_hostname(value: str, what: str = "hostname") -> str:
    """Return ``value`` if it is an RFC 1123 host name of at most 64 characters, else raise
    InvalidArgument: labels of letters, digits and '-' (not first or last), 1 to 63 each,
    joined by single '.'."""
    if len(value) > MAX_HOSTNAME_CHARS:
        raise InvalidArgument(f"{what} {_shown(value)} is {len(value)} characters; at most {MAX_HOSTNAME_CHARS} "
                              "are allowed (the kernel's HOST_NAME_MAX)")
    if not re.fullmatch(_HOSTNAME, value):
        raise InvalidArgument(f"{what} {_shown(value)} is not an RFC 1123 host name: use labels of letters, digits "
                              "and '-' (not first or last), at most 63 characters each, joined by '.'")
    return value


def validate_labels(labels: Mapping[str, str], what: str = "labels") -> None:
    """InvalidArgument unless every key is a Kubernetes qualified name and every value a label
    value's characters: letters, digits, '-', '_' or '.', starting and ending with a letter or
    digit, or empty; at most 253 of them (MAX_CRI_LABEL_VALUE_CHARS: kubelet's pod-name label)."""
    for key, value in labels.items():
        _check_qualified_name(key, what)
        if len(value) > MAX_CRI_LABEL_VALUE_CHARS:
            raise InvalidArgument(f"{what}[{_shown(key)}] is {len(value)} characters; at most "
                                  f"{MAX_CRI_LABEL_VALUE_CHARS} are allowed")
        if value and not re.fullmatch(_NAME, value):
            raise InvalidArgument(f"{what}[{_shown(key)}] {_shown(value)} is not a label value: use letters, "
                                  "digits, '-', '_' and '.', starting and ending with a letter or digit")


def validate_annotations(annotations: Mapping[str, str], what: str = "annotations") -> None:
    """InvalidArgument unless every key is a Kubernetes qualified name and keys and values
    together are at most 256 KiB (UTF-8), as the Kubernetes API server allows."""
    total = 0
    for key, value in annotations.items():
        _check_qualified_name(key, what)
        total += len(key.encode()) + len(value.encode())
    if total > MAX_ANNOTATIONS_BYTES:
        raise InvalidArgument(f"{what} are {total} bytes in all; at most {MAX_ANNOTATIONS_BYTES} (256 KiB, keys and "
                              "values together) are allowed")


def _check_qualified_name(key: str, what: str) -> None:
    prefix, slash, name = key.rpartition("/")
    # Lengths first: the patterns never see more than a few hundred characters.
    if (len(name) > MAX_LABEL_VALUE_CHARS or len(prefix) > _MAX_PREFIX_CHARS or not re.fullmatch(_NAME, name)
            or (slash and not re.fullmatch(_SUBDOMAIN, prefix))):
        raise InvalidArgument(f"{what} key {_shown(key)} is not a qualified name: use an optional lower-case DNS "
                              "subdomain and '/', then at most 63 letters, digits, '-', '_' or '.', starting and "
                              "ending with a letter or digit")


def _shown(value: str) -> str:
    """``value`` quoted for a message, cut short when long."""
    return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
