"""``python -m epochsync_dev.docs [--check]``: regenerate the generated pages (``make docs-ref``)."""

from __future__ import annotations

import argparse
import sys

from epochsync_dev.docs import REGENERATE, ROOT, generated_pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.docs", description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the pages that are stale")
    args = p.parse_args(argv)
    stale = []
    for path, text in generated_pages().items():
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        names = ", ".join(str(s) for s in stale)
        print(f"docs: stale generated pages: {names}; run {REGENERATE}", file=sys.stderr)
        return 1
    verb = "stale" if args.check else "rewritten"
    print(f"docs: {len(stale)} generated page(s) {verb}" + (": " + ", ".join(map(str, stale)) if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
