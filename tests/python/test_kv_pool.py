"""The node's KV pool from Python (wsup_client.fetch_kv_pool) against real
wsup-holder processes: the same memory as every other asker's, this
process's own fds, the journal's token hash as the engines compute it, and
clear errors for a holder without a pool or no holder at all."""

import mmap
import os

import pytest

import wsup_client as wc

F32 = "llama-tiny-f32"
MIB = 1 << 20


def test_a_pool_is_fetched_as_fds_of_the_same_memory(holder):
    h = holder(F32, "--kv-pool-mib", "4")
    with wc.fetch_kv_pool(h.socket) as a:
        assert a.backend == "host" and a.device == -1
        assert len(a.id) == 32 and a.allocations == [4 * MIB] and a.bytes == 4 * MIB
        assert len(a.fds) == 1
        with mmap.mmap(a.fds[0], 4 * MIB) as m:
            m[0:8] = b"WSUPTEST"
            m[4 * MIB - 1] = 0x5A
        b = wc.fetch_kv_pool(h.socket)
        try:
            assert b.id == a.id
            assert os.fstat(b.fds[0]).st_ino == os.fstat(a.fds[0]).st_ino
            with mmap.mmap(b.fds[0], 4 * MIB) as m:
                assert m[0:8] == b"WSUPTEST" and m[4 * MIB - 1] == 0x5A
        finally:
            b.close()
    assert a.fds == []


def test_the_token_hash_is_the_journals():
    # FNV-1a 64 over 4 little-endian bytes per id (docs/kv_journal.md).
    def fnv(ids, h=wc.TOKEN_HASH_SEED):
        for t in ids:
            for byte in (t & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return h

    ids = [1, 2, 300, -4, 65535]
    assert wc.token_hash(ids) == fnv(ids)
    assert wc.token_hash(ids[2:], wc.token_hash(ids[:2])) == wc.token_hash(ids)
    assert wc.token_hash([]) == wc.TOKEN_HASH_SEED


def test_no_pool_and_no_holder_are_named(holder, socket_dir):
    h = holder(F32)
    with pytest.raises(wc.WsupError) as e:
        wc.fetch_kv_pool(h.socket)
    assert e.value.code == wc.NOT_FOUND and "--kv-pool-mib" in str(e.value)
    nowhere = os.path.join(socket_dir, "nobody.sock")
    with pytest.raises(wc.WsupError) as e:
        wc.fetch_kv_pool(nowhere, timeout_ms=500)
    assert nowhere in str(e.value)
    with pytest.raises(wc.WsupError) as e:
        wc.fetch_kv_pool(h.socket, timeout_ms=0)
    assert e.value.code == wc.INVALID_ARGUMENT
    with pytest.raises(wc.WsupError) as e:
        wc.fetch_kv_pool(None)
    assert e.value.code == wc.INVALID_ARGUMENT
