import functools
import shutil
import subprocess

import numpy as np
import pytest

from pyro_gpn.data.lzw import decompress_lzw


def compress_lzw(data: bytes, max_bits: int = 16) -> bytes:
    """A reference ``compress`` 4.x encoder (block mode; clears the table as soon as it is full).

    Written independently of the decoder; ``gzip -d`` checks that its output is a valid .Z file.
    """
    bits, max_code, free, mark = 9, 511, 257, 0
    max_max_code = 1 << max_bits
    pieces: list[tuple[int, int]] = []  # (code, width), with padding as (0, n) entries
    position = 0

    def output(code: int, clear: bool = False) -> None:
        nonlocal bits, max_code, position, mark
        pieces.append((code, bits))
        position += bits
        if free > max_code or clear:
            group = 8 * bits
            padded = mark + -(-(position - mark) // group) * group
            pieces.append((0, padded - position))
            position = mark = padded
            if clear:
                bits, max_code = 9, 511
            else:
                bits += 1
                max_code = max_max_code if bits == max_bits else (1 << bits) - 1

    table = {bytes([i]): i for i in range(256)}
    word = data[:1]
    for value in data[1:]:
        extended = word + bytes([value])
        if extended in table:
            word = extended
            continue
        output(table[word])
        word = bytes([value])
        if free < max_max_code:
            table[extended] = free
            free += 1
        else:
            free = 257
            output(256, clear=True)
            table = {bytes([i]): i for i in range(256)}
    if word:
        output(table[word])
    number = 0
    shift = 0
    for code, width in pieces:
        number |= code << shift
        shift += width
    body = number.to_bytes((shift + 7) // 8, "little")
    return b"\x1f\x9d" + bytes([0x80 | max_bits]) + body


@functools.cache
def _samples() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    rows = rng.choice(np.array(list("bxo")), size=(1000, 42))
    table = "".join(",".join(row) + ",win\n" for row in rows).encode()
    return {
        "empty-ish": b"a",
        "repeats": b"abababababababab" * 50,
        "kwkwk": b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "random": rng.integers(0, 256, 8_000).astype(np.uint8).tobytes(),
        "table": table,
    }


@pytest.mark.parametrize("max_bits", [10, 12, 16])
@pytest.mark.parametrize("name", list(_samples()))
def test_round_trip(name: str, max_bits: int) -> None:
    data = _samples()[name]
    assert decompress_lzw(compress_lzw(data, max_bits)) == data


@pytest.mark.skipif(shutil.which("gzip") is None, reason="gzip not installed")
@pytest.mark.parametrize("max_bits", [10, 16])
def test_reference_encoder_agrees_with_gzip(max_bits: int) -> None:
    for data in _samples().values():
        packed = compress_lzw(data, max_bits)
        result = subprocess.run(["gzip", "-dc"], input=packed, capture_output=True, check=True)
        assert result.stdout == data


def test_rejects_invalid_streams() -> None:
    with pytest.raises(ValueError, match="magic"):
        decompress_lzw(b"\x1f\x8b\x08")
    with pytest.raises(ValueError, match="width"):
        decompress_lzw(b"\x1f\x9d\x88")
    with pytest.raises(ValueError, match="invalid .Z stream: code"):
        decompress_lzw(b"\x1f\x9d\x90" + (400).to_bytes(2, "little"))  # first code > 256
