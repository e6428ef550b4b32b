"""The bundle store's side of shipping a bundle (edgeinfer/fleet/transport.py), without Ray: what it lists, the
pieces it reads, and the paths it refuses. The fetch through Ray's object store is tested across nodes in
tests/test_fleet_nodes.py and tests/test_fleet_ray.py (an 88 MB reranker, eleven pieces)."""

from __future__ import annotations

import pytest

from edgeinfer.fleet.transport import CHUNK, BundleStore


@pytest.fixture
def store(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "tokenizer").mkdir(parents=True)
    (bundle / "model.bin").write_bytes(bytes(range(256)) * (2 * CHUNK // 256) + b"tail!")
    (bundle / "tokenizer" / "vocab.txt").write_text("abc")
    (bundle / "empty").write_bytes(b"")
    (tmp_path / "secret").write_text("not the bundle's")
    return BundleStore({"b": str(bundle)}), bundle


def test_the_store_lists_every_file_with_its_size(store):
    s, _ = store
    assert s.listing("b") == [("empty", 0), ("model.bin", 2 * CHUNK + 5), ("tokenizer/vocab.txt", 3)]


def test_a_read_returns_one_piece_from_its_offset(store):
    s, bundle = store
    data = (bundle / "model.bin").read_bytes()
    assert s.read("b", "model.bin", 0) == data[:CHUNK]
    assert s.read("b", "model.bin", CHUNK + 7) == data[CHUNK + 7:2 * CHUNK + 7]
    assert s.read("b", "model.bin", 2 * CHUNK) == b"tail!"
    assert s.read("b", "tokenizer/vocab.txt", 0) == b"abc"


@pytest.mark.parametrize("rel", ["../secret", "tokenizer/../../secret", "/etc/hostname"])
def test_a_path_outside_the_bundle_is_refused(store, rel):
    s, _ = store
    with pytest.raises(ValueError, match="outside bundle 'b'"):
        s.read("b", rel, 0)
