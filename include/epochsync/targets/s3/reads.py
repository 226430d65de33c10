"""Reading an ``s3`` replica: listings, HEADs, the walk, files' bytes, and the stat and existence
of many paths with few requests."""

from __future__ import annotations

import base64
import hashlib
import json
from collections import defaultdict
from typing import Any

from epochsync.core.errors import StoreError
from epochsync.stores.s3 import decode_listing
from epochsync.stores.s3_access import error_code
from epochsync.targets.base import Entry
from epochsync.targets.s3.meta import decode_meta
from epochsync.targets.s3.naming import ambiguous_key, attrs_key, dir_path_of, key_dirname, stripe_key
from epochsync.targets.s3.versions import S3Versions


class S3Reads(S3Versions):
    """What an ``s3`` replica holds, read with as few requests as its listings allow."""

    # ------------------------------------------------------------------ reading
    def list_keys(self, under: str = "") -> list[dict]:
        """Every current object under the prefix (and ``under`` below it)."""
        out = []
        token = None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": self.prefix + under, "EncodingType": "url"}
            if token:
                kw["ContinuationToken"] = token
            resp = decode_listing(self.io.call("LIST target", lambda c, kw=kw: c.list_objects_v2(**kw)))
            out.extend(resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return out
            token = resp["NextContinuationToken"]

    def head(self, rel_key: str) -> dict | None:
        """Returns the HEAD answer for ``rel_key`` under the prefix, or None when there is no such object."""
        key = self._full(rel_key)
        try:
            return self.io.call(f"HEAD {key}", lambda c: c.head_object(Bucket=self.bucket, Key=key))
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def walk(self, *, hashes: bool = True):
        """Returns the entries of every object under the prefix by path: files, symlinks and special
        files, and directories from their objects (:func:`dir_key`; the root is no entry); the rest of
        the control directory is left out."""
        layout = self.layout
        found: list[tuple[str, str]] = []  # (path, key)
        for o in self.list_keys():
            rel = o["Key"][len(self.prefix) :]
            d = dir_path_of(rel, self.control_dir, layout)
            if d is not None:
                if d != "":  # the root is not an entry
                    found.append((d, rel))
            elif rel.split("/", 1)[0] != self.control_dir:
                found.append((rel, rel))
        rels = [rel for _, rel in sorted(found)]

        def one(rel: str) -> Entry | None:
            h = self.head(rel)
            return None if h is None else self._entry(rel, h, hashes)

        if len(rels) < 2 * self.WALK_THREADS:
            entries = map(one, rels)
            yield from (e for e in entries if e is not None)
            return
        from concurrent.futures import ThreadPoolExecutor

        _ = self.io.client  # made once, before the threads share it (boto3 clients are thread-safe)
        with ThreadPoolExecutor(self.WALK_THREADS, thread_name_prefix="s3-walk") as pool:
            # map keeps the key order; a window of futures bounds the bytes held in memory
            window = 4 * self.WALK_THREADS
            for start in range(0, len(rels), window):
                for e in pool.map(one, rels[start : start + window]):
                    if e is not None:
                        yield e

    def _entry(self, rel: str, h: dict, hashes: bool) -> Entry:
        m = decode_meta(h.get("Metadata", {}))
        dir_path = dir_path_of(rel, self.control_dir, self.layout)
        kind = "dir" if dir_path is not None else (m["type"] or "file")
        path = rel if dir_path is None else dir_path
        size = m["size"] if m["size"] is not None else int(h.get("ContentLength") or 0)
        if m["attrs"]:
            m.update(self._sidecar(path, m))
        e = Entry(
            path=path,
            type=kind,
            size=size if kind == "file" else 0,
            mode=None if kind == "symlink" or m["mode"] is None else m["mode"] & 0o7777,
            uid=m["uid"],
            gid=m["gid"],
            symlink=m["symlink"],
            xattrs=m["xattrs"],
            mtime_ns=m["mtime"],
            fid=m["fid"],
        )
        if kind == "file" and hashes:
            e.sha256 = hashlib.sha256(self.read_file(path, head=h)).hexdigest()
        return e

    def _sidecar(self, path: str, m: dict) -> dict:
        """xattrs and symlink from the fid's attribute sidecar that the metadata names by sha256."""
        key = attrs_key(m["fid"] or "", self.control_dir)
        try:
            body = self.io.get_all(self.bucket, self._full(key))
        except Exception as exc:
            if error_code(exc) not in ("NoSuchKey", "404"):
                raise
            body = None
        if body is None or hashlib.sha256(body).hexdigest() != m["attrs"]:
            raise StoreError(
                f"{self.describe()}: {path!r}: its attribute sidecar {key} is "
                + ("missing" if body is None else "not the one its metadata names")
            )
        doc = json.loads(body)
        return {"xattrs": {k: base64.b64decode(v) for k, v in doc["xattrs"].items()}, "symlink": doc["symlink"]}

    def read_file(self, path: str, head: dict | None = None) -> bytes:
        """Returns the bytes of the file at ``path`` (its stripes assembled for a striped target)."""
        h = head or self.head(self.key_of(path, "file"))
        if h is None:
            raise StoreError(f"{self.describe()}: no object for {path}")
        m = decode_meta(h.get("Metadata", {}))
        if m["stripe"]:
            from epochsync.core.layout import assemble_file

            ss, sc = (int(x) for x in m["stripe"].split(":"))
            objs = []
            for i in range(sc):
                try:
                    key = self._full(stripe_key(m["fid"], i, self.control_dir))
                    objs.append(self.io.get_all(self.bucket, key))
                except Exception as exc:
                    if error_code(exc) not in ("NoSuchKey", "404"):
                        raise
                    objs.append(None)
            from epochsync.core.schema import Layout

            return assemble_file(Layout(ss, sc), int(m["size"] or 0), objs)
        # the version the HEAD (or the apply's fact) described, not whatever is current by now
        return self.io.get_all(self.bucket, self._full(self.key_of(path, "file")), h.get("VersionId"))

    def stat(self, path: str, type_hint: str | None = None) -> Entry | None:
        """The entry at ``path`` (``""``: the root, None until its attributes were first written)."""
        for t in ["dir"] if path == "" else [type_hint] if type_hint else ["file", "dir"]:
            h = self.head(self.key_of(path, t))
            if h is not None:
                return self._entry(self.key_of(path, t), h, hashes=False)
        return None

    def stat_many(self, wanted: list[tuple[str, str]], facts: dict | None = None) -> list[tuple[Entry | None, dict]]:
        """:meth:`stat` of many ``(path, type)`` with fewer requests: ``(entry or None, head)`` each,
        ``head`` what the entry was read from (give it to :meth:`read_file`: the bytes of that version).

        A key this epoch wrote (``facts``: :meth:`take_written`'s) is looked up in
        :meth:`versions_of` (a version listing per directory): when its current version is
        the one written, its entry comes from the metadata that write sent (a version never
        changes, so it is what a HEAD would return); no current version: absent. A current
        version that is another one (someone wrote the key since), and a key with no fact,
        cost a HEAD, as :meth:`stat` does.

        A key PUT by a conditional write (the fact says ``conditional``; a copy's fact does
        not, its size being the plan's and the listing's the store's, unless the source stated
        the copied version's length: :meth:`copy_from_source`) is not listed: its
        entry is the write's, the size that of the body sent. The store accepted that write only over the key as E-1's
        commit left it, and its answer names the version it made, so the listing would only
        add that nobody wrote the key between the apply and verify (docs/INTERNALS.md, "what
        verify still proves").
        """
        facts = facts or {}
        keys = [self.key_of(path, "dir" if path == "" else t) for path, t in wanted]
        listing = self.versions_of(k for k in keys if k in facts and not facts[k].get("conditional"))

        def one(k: str) -> tuple[Entry | None, dict]:
            w = facts.get(k)
            if w is not None and w.get("conditional") and w.get("version"):
                h = {"Metadata": w["meta"], "ContentLength": w["size"], "VersionId": w["version"]}
                return self._entry(k, h, hashes=False), h
            if k in listing:
                cur = listing[k]["current"]
                if cur is None:
                    return None, {}
                w = facts[k]
                if w.get("version") == cur["version"]:
                    h = {"Metadata": w["meta"], "ContentLength": cur["size"], "VersionId": cur["version"]}
                    return self._entry(k, h, hashes=False), h
            head = self.head(k)
            return (None, {}) if head is None else (self._entry(k, head, hashes=False), head)

        return self._in_threads(one, keys, "s3-stat")

    def _current_in_directory(
        self, directory: str, wanted: set[str], budget: int | None = None
    ) -> tuple[dict[str, bool], set[str] | None]:
        """Which ``wanted`` keys (directly in ``directory``) have a current object, from one listing
        of the directory's current objects (ListObjectsV2, delimiter ``/``), page by page.

        Returns the keys it answers for and, when it ran to its end, the sub-directories
        holding a current object (relative, ending in ``/``; else None). Past ``budget`` pages
        (default: as many as there are wanted keys), it stops and answers only for the keys it saw."""
        prefix = self.prefix + (directory + "/" if directory else "")
        full_of = {self._full(k): k for k in wanted}
        seen: set[str] = set()
        subdirs: set[str] = set()
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/", "EncodingType": "url"}
        if self.LIST_MAX_KEYS:
            kw["MaxKeys"] = self.LIST_MAX_KEYS
        pages = 0
        while True:
            resp = decode_listing(self.io.call(f"LIST {prefix}", lambda c, kw=kw: c.list_objects_v2(**kw)))
            pages += 1
            seen.update(full_of[o["Key"]] for o in resp.get("Contents") or [] if o["Key"] in full_of)
            subdirs.update(cp["Prefix"][len(self.prefix) :] for cp in resp.get("CommonPrefixes") or [])
            if not resp.get("IsTruncated"):
                return {k: k in seen for k in wanted}, subdirs
            if pages >= (len(wanted) if budget is None else budget):
                return dict.fromkeys(seen, True), None
            kw = {**kw, "ContinuationToken": resp["NextContinuationToken"]}

    def exists_many(self, paths: list[str]) -> list[bool]:
        """Whether anything (a file's or a directory's object) is at each path, with a listing of the
        current objects per directory instead of two HEADs per path.

        A key ``d/k`` alone in its folder ``d`` (a directory's object: ``.../_p/dir``) is absent
        without a request of its own when the listing of ``d``'s parent ran to its end and
        found nothing under ``d/``; that parent is listed when it holds two or more wanted
        keys or such folders (a directory rename: every old path's possible directory object
        is in one folder of the mirror). Any key a listing does not answer for costs a HEAD.
        """
        plans = [[self.key_of(p, "dir")] if p == "" else [self.key_of(p, "file"), self.key_of(p, "dir")] for p in paths]
        groups: dict[str, list[str]] = defaultdict(list)
        for k in sorted({k for ks in plans for k in ks}):
            if not ambiguous_key(k):
                groups[key_dirname(k)].append(k)
        below: dict[str, int] = defaultdict(int)  # folder -> wanted keys alone in a folder of it
        for d, ks in groups.items():
            if len(ks) == 1 and d:
                below[key_dirname(d)] += 1
        listed = [d for d in sorted(set(groups) | set(below)) if len(groups.get(d, ())) + below[d] >= 2]
        known: dict[str, bool] = {}
        subdirs: dict[str, set[str]] = {}
        for d, (found, subs) in zip(
            listed,
            self._in_threads(
                lambda d: self._current_in_directory(d, set(groups.get(d, ())), len(groups.get(d, ())) + below[d]),
                listed,
                "s3-list",
            ),
        ):
            known.update(found)
            if subs is not None:
                subdirs[d] = subs
        for k in {k for ks in plans for k in ks} - known.keys():
            d = key_dirname(k)
            if d and key_dirname(d) in subdirs and d + "/" not in subdirs[key_dirname(d)]:
                known[k] = False  # nothing at all under d/

        def one(keys: list[str]) -> bool:
            return any(known[k] if k in known else self.head(k) is not None for k in keys)

        return self._in_threads(one, plans, "s3-exists")
