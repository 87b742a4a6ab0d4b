"""Decoder for files made by Unix ``compress`` (``.Z``, LZW), which the standard library lacks.

UCI serves Connect-4 only in this format (``connect-4.data.Z``). The format, as written by
``compress`` 4.x and read by ``uncompress`` / ``gzip -d``:

* header ``1f 9d`` and a flag byte: bits 0-4 the maximum code width (9..16), bit 7 "block mode"
  (code 256 clears the table);
* codes packed least-significant bit first, starting 9 bits wide; the width grows by one when
  the table fills the current width, up to the maximum;
* codes come in groups of eight (``width`` bytes); when the width changes, or after a clear
  code, the rest of the current group is padding and is skipped.

The decoding loop follows Mark Adler's ``unlzw`` in pigz.
"""

from __future__ import annotations

__all__ = ["decompress_lzw"]

_MAGIC = b"\x1f\x9d"
_CLEAR = 256


def decompress_lzw(data: bytes) -> bytes:
    """Decompress the bytes of a ``.Z`` file; raises ``ValueError`` if they are not valid."""
    if len(data) < 3 or data[:2] != _MAGIC:
        raise ValueError("not a Unix compress (.Z) stream: bad magic bytes")
    max_bits, block_mode = data[2] & 0x1F, bool(data[2] & 0x80)
    if not 9 <= max_bits <= 16:
        raise ValueError(f"invalid .Z stream: maximum code width {max_bits} not in 9..16")
    stream = data[3:] + b"\x00\x00"  # padding so a code can always be read from 3 bytes
    total_bits = 8 * (len(data) - 3)
    bits, mask = 9, 0x1FF
    table: list[bytes] = [bytes([i]) for i in range(256)] + [b""]  # 256: clear (block mode)
    end = 256 if block_mode else 255  # last code with a table entry
    position = mark = 0  # bit positions: next code, start of the current group
    previous = b""
    output: list[bytes] = []

    def skip_group() -> int:
        group = 8 * bits
        return mark + -(-(position - mark) // group) * group

    while True:
        if end >= mask and bits < max_bits:
            position = mark = skip_group()
            bits, mask = bits + 1, (mask << 1) | 1
        if position + bits > total_bits:
            break
        byte, shift = position >> 3, position & 7
        word = stream[byte] | stream[byte + 1] << 8 | stream[byte + 2] << 16
        code = (word >> shift) & mask
        position += bits
        if code == _CLEAR and block_mode:
            position = mark = skip_group()
            bits, mask, end = 9, 0x1FF, 255
            del table[257:]
            continue
        if code <= end:
            entry = table[code]
        elif code == end + 1 and previous:
            entry = previous + previous[:1]  # the code being defined by this very step
        else:
            raise ValueError(f"invalid .Z stream: code {code} at bit {position - bits}")
        output.append(entry)
        if previous and end < mask:
            end += 1
            if end < len(table):
                table[end] = previous + entry[:1]
            else:
                table.append(previous + entry[:1])
        previous = entry
    return b"".join(output)
