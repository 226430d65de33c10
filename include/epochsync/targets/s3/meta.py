"""An entry's attributes as S3 user metadata (``x-amz-meta-es-*``), and the sidecar for those that do not fit."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from typing import Any

META_PREFIX = "es-"


#: S3's limit on user metadata: names (counted here with their ``x-amz-meta-`` prefix) and
#: values, UTF-8 bytes. AWS refuses a request over it; SeaweedFS and moto do not, so the
#: target enforces it itself (:meth:`S3Target.check_meta`).
META_LIMIT = 2048


def meta_size(meta: dict[str, str]) -> int:
    """Bytes of user metadata as :data:`META_LIMIT` counts them."""
    return sum(len(f"x-amz-meta-{k}".encode()) + len(v.encode()) for k, v in meta.items())


def _meta_fields(attrs: dict) -> dict[str, str]:
    m = {"type": attrs.get("type") or "file"}
    for k in ("mode", "uid", "gid", "mtime_ns", "atime_ns", "size"):
        if attrs.get(k) is not None:
            m[k.replace("_ns", "")] = str(int(attrs[k]))
    if attrs.get("fid"):
        m["fid"] = urllib.parse.quote(attrs["fid"], safe="")
    if attrs.get("symlink") is not None:
        m["symlink"] = urllib.parse.quote(attrs["symlink"], safe="")
    if attrs.get("xattrs"):
        m["xattrs"] = base64.urlsafe_b64encode(json.dumps(_xattr_doc(attrs), sort_keys=True).encode()).decode()
    if attrs.get("stripe"):
        m["stripe"] = attrs["stripe"]
    return {META_PREFIX + k: v for k, v in m.items()}


def _xattr_doc(attrs: dict) -> dict[str, str]:
    return {k: base64.b64encode(bytes.fromhex(v)).decode() for k, v in sorted((attrs.get("xattrs") or {}).items())}


def attrs_sidecar(attrs: dict) -> bytes | None:
    """The body of a fid's attribute sidecar when its metadata would exceed :data:`META_LIMIT`, else None.

    The sidecar (:func:`attrs_key`, in the control area, one per fid like stripe objects, so
    hard links share it) holds the unbounded attributes: xattrs and the symlink target. The
    objects' metadata then keeps the bounded ones and ``es-attrs``, the sidecar's sha256.
    """
    if meta_size(_meta_fields(attrs)) <= META_LIMIT:
        return None
    doc = {"xattrs": _xattr_doc(attrs), "symlink": attrs.get("symlink")}
    return json.dumps(doc, sort_keys=True).encode()


def encode_meta(attrs: dict) -> dict[str, str]:
    """Snapshot attributes → S3 user metadata (ASCII only, as S3 requires; at most :data:`META_LIMIT`)."""
    m = _meta_fields(attrs)
    body = attrs_sidecar(attrs)
    if body is not None:
        m.pop(META_PREFIX + "xattrs", None)
        m.pop(META_PREFIX + "symlink", None)
        m[META_PREFIX + "attrs"] = hashlib.sha256(body).hexdigest()
    return m


def decode_meta(meta: dict[str, str]) -> dict:
    """Returns the entry attributes an object's ``es-*`` metadata encodes (type, mode, ids, times,
    size, fid, symlink, xattrs, stripe)."""
    m = {k[len(META_PREFIX) :]: v for k, v in (meta or {}).items() if k.startswith(META_PREFIX)}
    out: dict[str, Any] = {"type": m.get("type")}
    for k in ("mode", "uid", "gid", "mtime", "size"):
        out[k] = int(m[k]) if k in m else None
    out["fid"] = urllib.parse.unquote(m["fid"]) if "fid" in m else None
    out["symlink"] = urllib.parse.unquote(m["symlink"]) if "symlink" in m else None
    xattrs = {}
    if "xattrs" in m:
        doc = json.loads(base64.urlsafe_b64decode(m["xattrs"]))
        xattrs = {k: base64.b64decode(v) for k, v in doc.items()}
    out["xattrs"] = xattrs
    out["stripe"] = m.get("stripe")
    out["attrs"] = m.get("attrs")  # the sha256 of the attribute sidecar holding xattrs and symlink
    return out


def meta_digest(meta: dict[str, str]) -> str:
    """SHA-256 of object metadata as a store returns it (names lower case, in any order): how the
    undo of a conditional write knows the version it made (:meth:`S3Target.undo`)."""
    doc = json.dumps({k.lower(): v for k, v in meta.items()}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(doc.encode()).hexdigest()
