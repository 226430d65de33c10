"""The keys of an ``s3`` replica: where each path, directory, stripe and attribute sidecar lives.

Also what a listing may do to a key: a store that ignores ``encoding-type=url`` lists the
characters XML cannot carry as U+FFFD (:func:`listed_key_is`).
"""

from __future__ import annotations

import base64
import re

from epochsync.targets.base import CONTROL_DIR, UnsafePathError, safe_relpath

#: The replica layout this code writes (the manifest's ``layout``; a manifest without one is
#: layout 1). Layout 2 keeps each directory's attributes in one empty, versioned object of
#: the control area, :func:`dir_key` (``<control_dir>/dirs/_a/_b/dir`` for ``a/b``; the
#: root ``<control_dir>/dirs/dir``): every component gets a ``_`` in front, so no
#: component is ever ``dir`` and no source name can collide with a directory's object.
#: Layout 1 kept it at ``<path>/.epochsync-dir`` (:data:`LEGACY_DIR_OBJECT`), which refused
#: a source entry of that name. A ``path/`` marker cannot carry metadata or versions on
#: SeaweedFS (its filer turns it into a real directory, version ``null``), so it is no
#: candidate for a rollback-able object. A target read at layout 1 is moved to layout 2
#: before the next epoch writes (:meth:`S3Target.upgrade_layout`).
LAYOUT = 2
#: the folder of the directory objects, in the control area
DIRS_AREA = "dirs"
#: the name of a directory's object in its folder of the mirror (no component is ``dir``: each has a ``_``)
DIR_OBJECT = "dir"
#: layout 1's directory object, ``<path>/.epochsync-dir`` (the root: ``prefix + .epochsync-dir``)
LEGACY_DIR_OBJECT = ".epochsync-dir"


_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
#: keys a request body in XML (DeleteObjects) cannot carry as they are: those, and a carriage
#: return (botocore writes it raw, and the store's XML parser reads it as a line feed)
XML_BODY_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0d\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def listed_key_is(listed: str, key: str) -> bool:
    """Does a listing's ``listed`` key name ``key``? A store that ignores ``encoding-type`` for
    a listing (SeaweedFS, for versions) sends the characters XML cannot carry as U+FFFD; with
    the listing's prefix being ``key`` itself, such a key of the same length is that key."""
    return listed == key or listed == _XML_FORBIDDEN.sub("\ufffd", key)


def ambiguous_key(key: str) -> bool:
    """A key a store that ignores ``encoding-type`` may list as another string (see :func:`listed_key_is`)."""
    return "\ufffd" in key or _XML_FORBIDDEN.search(key) is not None


def key_dirname(key: str) -> str:
    """The folder of ``key`` (``""`` for a key at the top), as a listing with delimiter ``/`` groups it."""
    return key.rsplit("/", 1)[0] if "/" in key else ""


def key_for(path: str, type_: str | None, control_dir: str = CONTROL_DIR, layout: int | None = None) -> str:
    """Key (under the prefix) of a replica path: a directory is its object :func:`dir_key` (the
    root, path ``""``, too); ``layout`` 1 is the layout before :data:`LAYOUT` (only to read a
    replica that has not moved yet)."""
    if path != "":
        safe_relpath(path, control_dir=control_dir)
    elif type_ != "dir":
        raise UnsafePathError("refusing the empty path: only the root directory has it")
    if type_ != "dir":
        return path
    if (LAYOUT if layout is None else layout) == 1:
        return f"{path}/{LEGACY_DIR_OBJECT}" if path else LEGACY_DIR_OBJECT
    return dir_key(path, control_dir)


def dir_key(path: str, control_dir: str = CONTROL_DIR) -> str:
    """The key (under the prefix) of directory ``path``'s object: ``<control_dir>/dirs/_a/_b/dir``
    for ``a/b``, ``<control_dir>/dirs/dir`` for the root (see :data:`LAYOUT`)."""
    folders = "".join(f"_{c}/" for c in path.split("/")) if path else ""
    return f"{control_dir}/{DIRS_AREA}/{folders}{DIR_OBJECT}"


def dir_path_of(rel_key: str, control_dir: str = CONTROL_DIR, layout: int | None = None) -> str | None:
    """The directory path whose object ``rel_key`` is (``""``: the root), or None for any other key."""
    if (LAYOUT if layout is None else layout) == 1:
        if rel_key == LEGACY_DIR_OBJECT:
            return ""
        if rel_key.endswith("/" + LEGACY_DIR_OBJECT) and rel_key.split("/", 1)[0] != control_dir:
            return rel_key[: -len(LEGACY_DIR_OBJECT) - 1]
        return None
    area = f"{control_dir}/{DIRS_AREA}/"
    if not rel_key.startswith(area) or not rel_key.endswith(DIR_OBJECT):
        return None
    folders = rel_key[len(area) : -len(DIR_OBJECT)]
    if folders == "":
        return ""
    parts = folders[:-1].split("/")
    if not folders.endswith("/") or any(not p.startswith("_") or len(p) < 2 for p in parts):
        return None
    return "/".join(p[1:] for p in parts)


def path_of_key(rel_key: str, control_dir: str = CONTROL_DIR) -> str:
    """The replica path a key of :func:`key_for` holds (a directory's object: its directory), for messages."""
    d = dir_path_of(rel_key, control_dir)
    return rel_key if d is None else d


def _fid_token(fid: str) -> str:
    return base64.urlsafe_b64encode(fid.encode()).decode().rstrip("=")


def stripe_key(fid: str, index: int, control_dir: str = CONTROL_DIR) -> str:
    """Key (under the prefix) of stripe object ``index`` of a file in a striped target."""
    return f"{control_dir}/stripes/{_fid_token(fid)}/{index:05d}"


def attrs_key(fid: str, control_dir: str = CONTROL_DIR) -> str:
    """Key (under the prefix) of a fid's attribute sidecar (see :func:`attrs_sidecar`)."""
    return f"{control_dir}/attrs/{_fid_token(fid)}"
