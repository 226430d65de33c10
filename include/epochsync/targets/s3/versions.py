"""The versions of an ``s3`` replica's keys (one version listing per directory where it can) and
the write fence's check over them."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from epochsync.stores.s3 import decode_listing
from epochsync.targets.s3.control import S3Control
from epochsync.targets.s3.naming import ambiguous_key, key_dirname, listed_key_is


def _no_versions() -> dict:
    return {"known": [], "current": None, "history": []}


def _add_version(found: dict, v: dict, kind: str) -> None:
    """One entry of a version listing (``Versions`` or ``DeleteMarkers``) into ``found``."""
    t = int(v["LastModified"].astimezone(UTC).timestamp() * 1e9)
    one = {"version": v["VersionId"], "marker": kind == "DeleteMarkers", "size": v.get("Size", 0), "time_ns": t}
    if v.get("ETag"):
        one["etag"] = bare_etag(v["ETag"])
    found["known"].append(v["VersionId"])
    found["history"].append(one)
    if v.get("IsLatest"):
        found["current"] = one


def bare_etag(value: str | None) -> str | None:
    """An ETag without its quotes (listings and responses quote it)."""
    return value.strip('"') if value else None


def _finish_versions(found: dict) -> dict:
    """``{"known": [ids], "current": the live version or None, "history": [...]}``."""
    cur = found["current"]
    return {"known": found["known"], "current": cur if cur and not cur["marker"] else None, "history": found["history"]}


def both_versions(current: dict | None, history: list[dict], since_ns: int | None) -> str:
    """`` (now: version V, N bytes, at T; at the last commit: version W, ...)``: what a write fence
    problem shows, so an operator sees both sides before deciding which one wins."""

    def one(v: dict | None) -> str:
        if v is None or v.get("marker"):
            return "absent"
        at = datetime.fromtimestamp(v["time_ns"] / 1e9, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return f"version {v['version']}, {v['size']} bytes, written {at}"

    before = None
    if since_ns is not None:
        older = [h for h in history if h["time_ns"] <= since_ns]
        before = max(older, key=lambda h: h["time_ns"]) if older else None
    return f" (now: {one(current)}; at the last commit: {one(before)})"


class S3Versions(S3Control):
    """Version listings of keys, and :meth:`fence_check`, the write fence's check of a plan's keys."""

    # ------------------------------------------------------------------ fence
    #: keys per version listing page (None: the store's default, 1,000 on S3); tests make it small
    LIST_MAX_KEYS: int | None = None

    def key_versions(self, rel_key: str) -> dict:
        """Every version and delete marker of exactly this key: ids, the current one, times."""
        key = self._full(rel_key)
        found = _no_versions()
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": key, "EncodingType": "url"}
        while True:
            resp = self.io.call(f"LIST versions {key}", lambda c, kw=kw: c.list_object_versions(**kw))
            encoded = resp.get("EncodingType") == "url"
            decode_listing(resp)

            def mine(listed: str, encoded: bool = encoded) -> bool:
                return listed == key if encoded else listed_key_is(listed, key)

            other = False
            for kind in ("Versions", "DeleteMarkers"):
                for v in resp.get(kind, []):
                    if not mine(v["Key"]):
                        other = True
                        continue
                    _add_version(found, v, kind)
            if other or not resp.get("IsTruncated"):
                break
            marker = resp.get("NextKeyMarker")
            marker = key if marker is not None and mine(marker) else marker  # as sent, not as listed
            kw = {**kw, "KeyMarker": marker, "VersionIdMarker": resp.get("NextVersionIdMarker")}
        return _finish_versions(found)

    def _list_directory(self, directory: str, wanted: set[str]) -> dict[str, dict]:
        """Versions of the ``wanted`` keys (all directly in ``directory``) from one version listing of
        the directory (delimiter ``/``), page by page; returns the keys it could answer for.

        The listing stops early, leaving the keys it has not passed to one listing each, once
        it has cost as many pages as there are wanted keys (a large directory with few changed
        keys), or at a page marker that is not the key it stands for (a store that does not
        URL-encode version listings, after a key with characters XML cannot carry) or that is
        a sub-directory (SeaweedFS orders a directory ``a`` before a file ``a b``). Its common
        prefixes are not used: SeaweedFS drops some of them when it pages.
        """
        prefix = self.prefix + (directory + "/" if directory else "")
        full_of = {self._full(k): k for k in wanted}
        found = {k: _no_versions() for k in wanted}
        seen: set[str] = set()
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/", "EncodingType": "url"}
        if self.LIST_MAX_KEYS:
            kw["MaxKeys"] = self.LIST_MAX_KEYS
        pages, complete_below = 0, None
        while True:
            resp = self.io.call(f"LIST versions {prefix}", lambda c, kw=kw: c.list_object_versions(**kw))
            pages += 1
            encoded = resp.get("EncodingType") == "url"
            decode_listing(resp)
            for kind in ("Versions", "DeleteMarkers"):
                for v in resp.get(kind, []):
                    rel = full_of.get(v["Key"])
                    if rel is not None:
                        _add_version(found[rel], v, kind)
                        seen.add(rel)
            if not resp.get("IsTruncated"):
                return {k: _finish_versions(v) for k, v in found.items()}
            marker = resp.get("NextKeyMarker")
            reliable = bool(marker) and not marker.endswith("/") and (encoded or not ambiguous_key(marker))
            if reliable:  # the next page starts at this key: every key before it is complete
                complete_below = marker
            if not reliable or pages >= len(wanted):
                # a key not seen yet may still come (the store's order is not checked): its own listing
                return (
                    {}
                    if complete_below is None
                    else {
                        rel: _finish_versions(found[rel])
                        for full, rel in full_of.items()
                        if rel in seen and full < complete_below
                    }
                )
            kw = {**kw, "KeyMarker": marker}
            kw.pop("VersionIdMarker", None)
            if resp.get("NextVersionIdMarker"):
                kw["VersionIdMarker"] = resp["NextVersionIdMarker"]

    def versions_of(self, rel_keys) -> dict[str, dict]:
        """:meth:`key_versions` of many keys, with one version listing per directory that holds two
        or more of them (paginated) instead of one listing per key.

        A key alone in its directory gets a listing of its own, and so do keys with
        characters a version listing may not carry as they are (see :func:`listed_key_is`).
        Each key's answer is the one a listing of that key alone gives: every version, the
        current one, their sizes and times.
        """
        keys = sorted(set(rel_keys))
        groups: dict[str, list[str]] = defaultdict(list)
        for k in keys:
            if not ambiguous_key(k):
                groups[key_dirname(k)].append(k)
        listed = {d: ks for d, ks in groups.items() if len(ks) >= 2}
        out: dict[str, dict] = {}
        for found in self._in_threads(lambda d: self._list_directory(d, set(listed[d])), list(listed), "s3-list"):
            out.update(found)
        rest = [k for k in keys if k not in out]
        out.update(zip(rest, self._in_threads(self.key_versions, rest, "s3-fence")))
        return out

    def fence_check(self, expect: list[dict], since_ns: int | None, conditional=()) -> tuple[list[str], dict[str, Any]]:
        """``expect`` items: ``{"key", "present", "size"}``; returns problems and key → versions.

        The versions come from :meth:`versions_of` (a listing per directory of the plan's keys):
        the same facts per key as a listing of each key, so the same checks. A key in
        ``conditional`` (keys the epoch writes once, whole, when the store honours
        :meth:`conditional_writes`) is not listed: its state is the condition its write
        carries, ``{"condition": {"present", "since_ns"}}`` (:meth:`_journal_key`), and the
        store checks it when the write arrives, in the same request."""
        problems, state = [], {}
        conditional = set(conditional) if since_ns is not None else set()
        deferred = {
            item["key"] for item in expect if item["key"] in conditional and item.get("present") in (True, False)
        }
        listing = self.versions_of(item["key"] for item in expect if item["key"] not in deferred)
        for item in expect:
            rel = item["key"]
            if rel in deferred:
                state[rel] = {"condition": {"present": bool(item["present"]), "since_ns": since_ns}}
                continue
            v = dict(listing[rel])
            history = v.pop("history", [])
            state[rel] = v
            cur = v["current"]
            if item.get("present") is None and "present" in item:  # either state is the replica's own
                if cur is not None and since_ns is not None and cur["time_ns"] > since_ns:
                    problems.append(f"{rel}: written after the last commit")
                continue
            if not item.get("present"):
                if cur is not None:
                    problems.append(
                        f"{rel}: exists but the replica at the last epoch did not have it"
                        f"{both_versions(cur, history, since_ns)}"
                    )
                continue
            if cur is None:
                problems.append(f"{rel}: missing{both_versions(cur, history, since_ns)}")
            elif item.get("size") is not None and cur["size"] != item["size"]:
                problems.append(
                    f"{rel}: size {cur['size']}, expected {item['size']}{both_versions(cur, history, since_ns)}"
                )
            elif since_ns is not None and cur["time_ns"] > since_ns:
                problems.append(f"{rel}: written after the last commit{both_versions(cur, history, since_ns)}")
        return problems, state
