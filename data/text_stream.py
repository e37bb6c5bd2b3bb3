"""The text of files, streamed in pieces: a first pass that checks and counts it (`scan`), then the pieces of
each split (`split_pieces`) and their paragraphs (`Paragraphs`), so no more than a few pieces are in memory
whatever the files' size.

A piece is up to PIECE_BYTES of the files' bytes ending just after a newline (the files run on into each
other: a piece may hold the end of one and the start of the next); a line longer than that is cut between
two UTF-8 characters.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import re

from data.schema import DataError

PIECE_BYTES = 4 << 20
BLANK_LINE = r"\n(?:[ \t\r\f\v]*\n)+"  # one or more empty (or whitespace-only) lines between paragraphs
_SPACE = " \t\r\f\v\n"  # what BLANK_LINE is made of


@dataclasses.dataclass
class Scan:
    """What the first pass learns: sizes, the sha256 of the bytes and (when asked) the set of characters."""

    bytes: int = 0
    chars: int = 0
    sha256: str = ""
    charset: set[str] | None = None


def scan(paths: list[str], want_charset: bool, piece_bytes: int = PIECE_BYTES, progress=None) -> Scan:
    """Reads every file once: checks it is UTF-8, counts its bytes and characters, hashes the whole text;
    `progress(bytes read)` is told after every block.

    Raises:
        DataError: For a file that is missing or not UTF-8 (naming the offset of the first bad byte).
    """
    result, digest = Scan(charset=set() if want_charset else None), hashlib.sha256()
    for path in paths:
        decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
        for raw in _file_blocks(path, piece_bytes):
            digest.update(raw)
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                bad = offset - len(decoder.getstate()[0]) + e.start
                raise DataError(f"text file {path} is not UTF-8 (byte {bad}); convert it to UTF-8") from None
            offset += len(raw)
            if progress is not None:
                progress(result.bytes + offset)
            result.chars += len(text)
            if result.charset is not None:
                result.charset.update(text)
        result.bytes += offset
    result.sha256 = digest.hexdigest()
    return result


def _file_blocks(path: str, size: int):
    """The file's bytes in blocks of `size`, then b"" (the end)."""
    try:
        with open(path, "rb") as f:
            while block := f.read(size):
                yield block
    except OSError as e:
        raise DataError(f"cannot read text file {path}: {e.strerror}") from None
    yield b""


def read_pieces(paths: list[str], piece_bytes: int = PIECE_BYTES):
    """The files' bytes, concatenated, in pieces ending after a newline (or between UTF-8 characters)."""
    carry = b""
    for path in paths:
        for block in _file_blocks(path, piece_bytes):
            data = carry + block
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) >= piece_bytes:  # a long line: cut before its last character's first byte
                cut = len(data) - 1
                while cut > 1 and data[cut] & 0xC0 == 0x80:
                    cut -= 1
            if cut:
                yield data[:cut]
            carry = data[cut:]
    if carry:
        yield carry


def split_pieces(paths: list[str], tokens: str, cut: int, piece_bytes: int = PIECE_BYTES):
    """("train" or "eval", units, their UTF-8 byte count) for the files' text, train the first `cut` units.

    Units are characters (a str) for `char` tokens, bytes for `byte`; `subword` tokens get a str cut at the
    first character that starts at or after byte `cut`.
    """
    offset = 0
    for raw in read_pieces(paths, piece_bytes):
        units = raw.decode("utf-8") if tokens == "char" else raw
        here = cut - offset
        offset += len(units)
        if here <= 0 or here >= len(units):
            parts = [("train" if here > 0 else "eval", units)]
        else:
            while tokens == "subword" and here < len(raw) and raw[here] & 0xC0 == 0x80:
                here += 1
            parts = [("train", units[:here]), ("eval", units[here:])]
        for split, part in parts:
            if part:
                size = len(part) if isinstance(part, bytes) else len(part.encode("utf-8"))
                yield split, (part.decode("utf-8") if tokens == "subword" else part), size


class Paragraphs:
    """A split's pieces -> (fragment, ends_document) pairs: documents "paragraphs" ends one at each blank line
    (BLANK_LINE), as `re.split` of the whole split would; "none" ends one only at the split's end.

    Trailing whitespace of a piece waits for the next piece: a blank line may run on into it.
    """

    def __init__(self, documents: str, is_bytes: bool):
        self.split = documents == "paragraphs"
        self.pattern = re.compile(BLANK_LINE.encode() if is_bytes else BLANK_LINE)
        self.space = _SPACE.encode() if is_bytes else _SPACE
        self.pending = b"" if is_bytes else ""

    def feed(self, units) -> list:
        if not self.split:
            return [(units, False)]
        text = self.pending + units
        keep = len(text.rstrip(self.space))
        self.pending = text[keep:]
        return self._fragments(text[:keep], last_ends=False)

    def end(self) -> list:
        fragments = self._fragments(self.pending, last_ends=True) if self.split else [(self.pending, True)]
        self.pending = self.pending[:0]
        return fragments

    def _fragments(self, text, last_ends: bool) -> list:
        parts = self.pattern.split(text)
        return [(part, True) for part in parts[:-1]] + [(parts[-1], last_ends)]
