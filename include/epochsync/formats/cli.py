"""The ``epochsync parse`` verb: changelog files of any supported format → canonical JSON Lines.

Imports nothing heavy: parsing a changelog never loads Spark or Airflow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from epochsync.core.argtypes import non_negative
from epochsync.core.errors import ParseError
from epochsync.core.schema import write_jsonl
from epochsync.formats import FORMATS, ParseOptions, parse_stream
from epochsync.formats.common import ParseContext

#: exit status when every record parsed but some bad lines went to the quarantine file
EXIT_QUARANTINED = 3

_EPILOG = f"""\
Files are read in the order given as one stream of the same server: the index must keep
increasing from one file to the next, and Lustre MARK epochs keep counting.

epochs: --epoch N gives every record epoch N. Otherwise Lustre text takes its epochs from
MARK records (records up to and including the first MARK are in --first-epoch, and each
MARK is followed by a synthesized EPOCH record closing its epoch; --no-marks: epoch 0);
Gluster and Lustre with --no-marks get epoch 0 (time windows need a config: see
'epochsync replicate'); JSON Lines keep their own epochs.

server: Lustre text defaults to MDT0000, Gluster to brick0; JSON Lines carry their own
(--server fills in a missing one).

exit status:
  0  every record parsed
  1  a bad line (the error, FILE:LINE: reason, is on stderr; records before it were written)
  2  usage error
  {EXIT_QUARANTINED}  every good record written, but bad lines went to the --quarantine file
     (a summary line is on stderr)
"""


def configure_parse(parser: argparse.ArgumentParser) -> None:
    """Add the ``parse`` options to the verb's sub-parser."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("--format", required=True, choices=FORMATS, help="changelog format of the input files")
    parser.add_argument("--server", metavar="NAME", help="server (MDT, OST, brick) the records come from")
    parser.add_argument("--epoch", type=non_negative, metavar="N", help="give every record epoch N")
    parser.add_argument(
        "--first-epoch",
        type=non_negative,
        default=1,
        metavar="N",
        help="Lustre MARK epochs: the epoch of the records before the first MARK (default 1)",
    )
    parser.add_argument("--no-marks", action="store_true", help="Lustre: do not take epochs from MARK records")
    parser.add_argument(
        "--quarantine",
        metavar="FILE",
        help="write bad lines to FILE (JSON Lines: file, line, offset, server, index, reason, text) and go on",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="changelog files, read in the order given")


def run_parse(args: argparse.Namespace) -> int:
    """Parse ``args.files`` and write canonical JSON Lines to stdout; returns the exit status."""
    quarantined = 0
    qfile = None
    if args.quarantine:
        try:
            qfile = open(args.quarantine, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise ParseError(args.quarantine, None, f"cannot write the quarantine file: {exc.strerror}") from None

    def quarantine(error: ParseError) -> None:
        nonlocal quarantined
        assert qfile is not None  # the parser's sink only when the file is open (on_error below)
        quarantined += 1
        qfile.write(json.dumps(error.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n")

    opts = ParseOptions(
        server=args.server,
        epoch=args.epoch,
        epochs_from_marks=args.format == "lustre" and not args.no_marks,
        first_epoch=args.first_epoch,
        on_error=quarantine if qfile is not None else None,
        context=ParseContext(),
    )
    written = 0
    out = sys.stdout
    try:
        for path in args.files:
            try:
                fh = open(path, "rb")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise ParseError(path, None, f"cannot read: {exc.strerror}") from None
            with fh:
                written += write_jsonl(parse_stream(args.format, fh, path, opts), out)
        out.flush()
    except BrokenPipeError:
        # the reader went away (``| head``): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        if qfile is not None:
            qfile.close()
    if quarantined:
        print(
            f"epochsync parse: {written} records written; {quarantined} bad "
            f"{'line' if quarantined == 1 else 'lines'} quarantined in {args.quarantine}",
            file=sys.stderr,
        )
        return EXIT_QUARANTINED
    return 0
