import gzip
import hashlib
import io
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pyro_gpn.data import download
from pyro_gpn.data.download import (
    BUNDLED_DIR,
    ChecksumError,
    DataUnavailableError,
    RemoteFile,
    default_data_dir,
    expected_checksum,
    fetch,
    verify,
)

PAYLOAD = b"1,2,3\n4,5,6\n" * 1000
FILE = RemoteFile("toy/table.csv", "https://example.org/table.csv")


@pytest.fixture
def manifest(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, str]]:
    """Replace the shipped checksums with one synthetic entry for ``FILE``."""
    entries = {FILE.path: ("sha256", hashlib.sha256(PAYLOAD).hexdigest())}
    monkeypatch.setattr(download, "_manifest", lambda: entries)
    return entries


class _Response(io.BytesIO):
    """What ``urlopen`` returns: a readable context manager; optionally fails mid-stream."""

    def __init__(self, data: bytes, fail_after: int | None = None) -> None:
        super().__init__(data)
        self.fail_after = fail_after

    def read(self, size: int | None = -1) -> bytes:
        if self.fail_after is not None and self.tell() >= self.fail_after:
            raise ConnectionResetError("connection reset by peer")
        return super().read(min(size, 1000) if size and size > 0 else 1000)


def _serve(monkeypatch: pytest.MonkeyPatch, data: bytes, fail_after: int | None = None) -> list:
    calls: list[str] = []

    def urlopen(url: str, timeout: float | None = None) -> _Response:
        calls.append(url)
        return _Response(data, fail_after)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def test_manifest_lists_every_shipped_and_shared_file() -> None:
    assert expected_checksum("uci/adult.data")[0] == "sha256"
    assert expected_checksum("mnist/train-images-idx3-ubyte.gz") == (
        "md5",
        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    )
    bundled = [p for p in (BUNDLED_DIR / "uci-regression").rglob("*") if p.is_file()]
    assert len(bundled) == 44
    for path in bundled:  # the shipped copy verifies against the manifest
        verify(path, path.relative_to(BUNDLED_DIR).as_posix())
    with pytest.raises(KeyError, match="no checksum"):
        expected_checksum("uci/unknown.data")


def test_manifest_agrees_with_shared_sha256sums(shared_data: Path) -> None:
    for line in (shared_data / "SHA256SUMS").read_text().splitlines():
        digest, path = line.split()
        assert expected_checksum(path) == ("sha256", digest)


def test_default_data_dir_follows_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRO_GPN_DATA_DIR", "/some/where")
    assert default_data_dir() == Path("/some/where")
    monkeypatch.delenv("PYRO_GPN_DATA_DIR")
    assert default_data_dir() == Path.home() / ".cache" / "pyro_gpn"


def test_existing_file_is_verified_and_used_in_place(tmp_path: Path, manifest: dict) -> None:
    (tmp_path / "toy").mkdir()
    (tmp_path / FILE.path).write_bytes(PAYLOAD)
    assert fetch(FILE, tmp_path) == tmp_path / FILE.path


def test_corrupted_file_raises_checksum_error(tmp_path: Path, manifest: dict) -> None:
    (tmp_path / "toy").mkdir()
    corrupted = bytearray(PAYLOAD)
    corrupted[100] ^= 0x01
    (tmp_path / FILE.path).write_bytes(bytes(corrupted))
    with pytest.raises(ChecksumError, match="corrupted"):
        fetch(FILE, tmp_path)
    assert (tmp_path / FILE.path).read_bytes() == bytes(corrupted)  # left for the user to see


def test_md5_entries_are_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        download, "_manifest", lambda: {FILE.path: ("md5", hashlib.md5(PAYLOAD).hexdigest())}
    )
    (tmp_path / "toy").mkdir()
    (tmp_path / FILE.path).write_bytes(PAYLOAD)
    assert fetch(FILE, tmp_path).is_file()
    (tmp_path / FILE.path).write_bytes(PAYLOAD[:-1])
    with pytest.raises(ChecksumError, match="md5"):
        fetch(FILE, tmp_path)


def test_offline_error_says_which_file_to_put_where(tmp_path: Path, manifest: dict) -> None:
    with pytest.raises(DataUnavailableError) as error:  # urlopen raises URLError (conftest)
        fetch(FILE, tmp_path, hint="Extra advice.")
    message = str(error.value)
    assert "network disabled" in message
    assert FILE.url in message and str(tmp_path / FILE.path) in message
    assert message.endswith("Extra advice.")
    assert _leftovers(tmp_path) == []


def test_download_false_never_touches_the_network(
    tmp_path: Path, manifest: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _serve(monkeypatch, PAYLOAD)
    with pytest.raises(DataUnavailableError, match="is not in"):
        fetch(FILE, tmp_path, download=False)
    assert calls == []


def test_download_is_atomic_and_a_retry_succeeds(
    tmp_path: Path, manifest: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve(monkeypatch, PAYLOAD, fail_after=len(PAYLOAD) // 2)
    with pytest.raises(DataUnavailableError, match="connection reset"):
        fetch(FILE, tmp_path)
    assert _leftovers(tmp_path) == []  # no partial target, no temporary file

    calls = _serve(monkeypatch, PAYLOAD)
    path = fetch(FILE, tmp_path)
    assert path.read_bytes() == PAYLOAD and calls == [FILE.url]
    assert _leftovers(tmp_path) == ["table.csv"]
    fetch(FILE, tmp_path)  # now cached: no second download
    assert calls == [FILE.url]


def test_interrupt_during_download_leaves_nothing(
    tmp_path: Path, manifest: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Interrupted(_Response):
        def read(self, size: int | None = -1) -> bytes:
            if self.tell():
                raise KeyboardInterrupt
            return super().read(size)

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: Interrupted(PAYLOAD))
    with pytest.raises(KeyboardInterrupt):
        fetch(FILE, tmp_path)
    assert _leftovers(tmp_path) == []


def test_compressed_download_is_stored_decompressed(
    tmp_path: Path, manifest: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = RemoteFile(FILE.path, FILE.url + ".gz", decompress=gzip.decompress)
    _serve(monkeypatch, gzip.compress(PAYLOAD))
    assert fetch(packed, tmp_path).read_bytes() == PAYLOAD  # checksum is of the content


def test_wrong_download_is_rejected_and_not_written(
    tmp_path: Path, manifest: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve(monkeypatch, PAYLOAD + b"tampered")
    with pytest.raises(ChecksumError, match="nothing was written"):
        fetch(FILE, tmp_path)
    assert _leftovers(tmp_path) == []


def test_real_file_flipped_byte_raises_checksum_error(shared_data: Path, tmp_path: Path) -> None:
    from pyro_gpn.data import load_dataset

    (tmp_path / "uci").mkdir()
    copy = tmp_path / "uci" / "letter-recognition.data"
    shutil.copyfile(shared_data / "uci" / "letter-recognition.data", copy)
    raw = bytearray(copy.read_bytes())
    raw[1234] ^= 0x01
    copy.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="letter-recognition.data"):
        load_dataset("letter", tmp_path)


def test_real_loader_offline_names_file_and_place(tmp_path: Path) -> None:
    from pyro_gpn.data import load_dataset

    with pytest.raises(DataUnavailableError) as error:
        load_dataset("adult", tmp_path)
    message = str(error.value)
    assert str(tmp_path / "uci" / "adult.data") in message
    assert "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data" in message
    assert isinstance(error.value.__cause__, urllib.error.URLError)


def test_real_loader_downloads_into_the_cache(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyro_gpn.data import load_dataset

    calls = _serve(monkeypatch, (shared_data / "uci" / "letter-recognition.data").read_bytes())
    data = load_dataset("letter")  # data_dir from $PYRO_GPN_DATA_DIR (a temporary folder)
    assert data.num_features == 16
    assert calls == [
        "https://archive.ics.uci.edu/ml/machine-learning-databases/"
        "letter-recognition/letter-recognition.data"
    ]
    assert (default_data_dir() / "uci" / "letter-recognition.data").is_file()
