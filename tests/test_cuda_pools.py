"""The session's cache of small device allocations (mmd.cuda.pools.DeviceCache), on the CPU.

Blocks are plain records made and freed by callables that log what they did,
so each test sees exactly which allocations and frees the GPU would have had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd.cuda.memory import device_bytes
from mmd.cuda.pools import (
    DEVICE_CACHE_BLOCK_BYTES,
    DEVICE_CACHE_CAP_BYTES,
    DEVICE_CACHE_MIN_BLOCK,
    DeviceCache,
    size_class,
)

KIB = 1024


@dataclass(eq=False)
class Block:
    """One fake cuMemAlloc: its size, and a number to tell blocks apart in messages."""

    nbytes: int
    number: int


@dataclass
class Device:
    """Makes and frees blocks, logging both; ``fail_alloc``/``fail_release``: the next such call raises."""

    made: list[Block] = field(default_factory=list)
    released: list[Block] = field(default_factory=list)
    fail_alloc: bool = False
    fail_release: set[int] = field(default_factory=set)

    def allocate(self, nbytes: int) -> Block:
        if self.fail_alloc:
            raise MemoryError("cuMemAlloc failed: out of memory")
        block = Block(nbytes, len(self.made))
        self.made.append(block)
        return block

    def release(self, block: Block) -> None:
        if block.number in self.fail_release:
            raise RuntimeError(f"cuMemFree failed for block {block.number}")
        assert block not in self.released, f"block {block.number} freed twice"
        self.released.append(block)

    def cache(self, cap_bytes: int = DEVICE_CACHE_CAP_BYTES) -> DeviceCache[Block]:
        """A cache over this device; a cap below the usual block size takes blocks up to the cap."""
        block_bytes = min(DEVICE_CACHE_BLOCK_BYTES, cap_bytes)
        return DeviceCache(self.allocate, self.release, block_bytes=block_bytes, cap_bytes=cap_bytes)


def test_a_block_given_back_is_the_next_take_of_its_size():
    device = Device()
    cache = device.cache()
    block, reused = cache.take(4 * KIB)
    assert not reused and device.made == [block] and cache.held_bytes == 0
    cache.give(4 * KIB, block)
    assert cache.held_bytes == 4 * KIB and device.released == []
    again, reused = cache.take(4 * KIB)
    assert again is block and reused and cache.held_bytes == 0
    assert len(device.made) == 1


def test_neighbouring_sizes_share_a_size_class_and_others_do_not():
    device = Device()
    cache = device.cache()
    block, _ = cache.take(33 * 33 * 4)  # 4356 bytes: an 8 KiB block
    assert block.nbytes == 8 * KIB
    cache.give(33 * 33 * 4, block)
    same, reused = cache.take(40 * 40 * 4)  # 6400 bytes: the same class
    assert same is block and reused
    cache.give(40 * 40 * 4, same)
    other, reused = cache.take(32 * 32 * 4)  # 4 KiB: a class of its own
    assert other is not block and not reused and other.nbytes == 4 * KIB


def test_tiny_jobs_share_the_smallest_block():
    assert {size_class(device_bytes(n, n)) for n in range(0, 33)} == {DEVICE_CACHE_MIN_BLOCK}


def test_the_cache_takes_up_to_a_256x256_matrix():
    cache = Device().cache()
    assert cache.holds_size(device_bytes(256, 256)) and device_bytes(256, 256) == DEVICE_CACHE_BLOCK_BYTES
    assert not cache.holds_size(device_bytes(256, 257))


def test_three_blocks_of_every_class_fit_well_within_the_cap():
    """A job holds three blocks at once: in steady use, whatever the sizes, nothing is evicted."""
    classes = {size_class(n) for n in range(1, DEVICE_CACHE_BLOCK_BYTES + 1, 512)}
    assert 3 * sum(classes) <= DEVICE_CACHE_CAP_BYTES // 8


@given(st.integers(min_value=0, max_value=2 * DEVICE_CACHE_BLOCK_BYTES))
def test_size_class_is_the_next_power_of_two_from_the_smallest_block(nbytes):
    size = size_class(nbytes)
    assert size & (size - 1) == 0
    assert size >= max(nbytes, DEVICE_CACHE_MIN_BLOCK)
    assert size == DEVICE_CACHE_MIN_BLOCK or size < 2 * nbytes


def test_the_oldest_blocks_given_back_are_freed_first_at_the_cap():
    device = Device()
    cache = device.cache(cap_bytes=16 * KIB)
    a, b, c, d = (cache.take(n)[0] for n in (4 * KIB, 8 * KIB, 4 * KIB, 8 * KIB))
    cache.give(4 * KIB, a)
    cache.give(8 * KIB, b)
    cache.give(4 * KIB, c)
    assert cache.held_bytes == 16 * KIB and device.released == []
    cache.give(8 * KIB, d)  # 24 KiB: a, then b (the oldest two) go
    assert device.released == [a, b] and cache.held_bytes == 12 * KIB
    assert cache.take(4 * KIB) == (c, True) and cache.take(8 * KIB) == (d, True)


def test_a_class_hands_out_its_newest_block_and_evicts_its_oldest():
    device = Device()
    cache = device.cache(cap_bytes=8 * KIB)
    old, new = cache.take(4 * KIB)[0], cache.take(4 * KIB)[0]
    cache.give(4 * KIB, old)
    cache.give(4 * KIB, new)
    assert cache.take(4 * KIB) == (new, True)
    cache.give(4 * KIB, new)
    third = cache.take(4 * KIB)[0]
    assert third is new
    extra, reused = cache.take(4 * KIB)
    assert extra is old and reused
    fresh, reused = cache.take(4 * KIB)
    assert not reused
    for block in (new, old, fresh):
        cache.give(4 * KIB, block)
    assert device.released == [new]  # given back first of the three, so the first to go


def test_close_frees_every_kept_block_and_the_cache_starts_empty_again():
    device = Device()
    cache = device.cache()
    blocks = [cache.take(n)[0] for n in (4 * KIB, 4 * KIB, 64 * KIB, DEVICE_CACHE_BLOCK_BYTES)]
    for block in blocks:
        cache.give(block.nbytes, block)
    cache.close()
    assert sorted(b.number for b in device.released) == [b.number for b in blocks]
    assert cache.held_bytes == 0
    block, reused = cache.take(4 * KIB)
    assert not reused and block not in blocks


def test_close_frees_the_rest_when_one_free_fails_and_raises_the_first_failure():
    device = Device(fail_release={1, 2})
    cache = device.cache()
    blocks = [cache.take(4 * KIB)[0] for _ in range(4)]
    for block in blocks:
        cache.give(4 * KIB, block)
    with pytest.raises(RuntimeError, match="block 1"):
        cache.close()
    assert [b.number for b in device.released] == [0, 3]
    assert cache.held_bytes == 0
    cache.close()  # nothing left to free, nothing raised
    assert [b.number for b in device.released] == [0, 3]


def test_a_failed_allocation_leaves_the_cache_as_it_was():
    device = Device()
    cache = device.cache()
    kept = cache.take(4 * KIB)[0]
    cache.give(4 * KIB, kept)
    device.fail_alloc = True
    with pytest.raises(MemoryError, match="out of memory"):
        cache.take(8 * KIB)  # a miss: cuMemAlloc fails
    assert cache.held_bytes == 4 * KIB
    assert cache.take(4 * KIB) == (kept, True)  # a hit needs no allocation
    device.fail_alloc = False
    assert cache.take(8 * KIB)[1] is False


def test_a_failed_free_while_evicting_is_raised_with_the_cache_within_its_cap():
    device = Device(fail_release={0})
    cache = device.cache(cap_bytes=8 * KIB)
    blocks = [cache.take(4 * KIB)[0] for _ in range(3)]
    cache.give(4 * KIB, blocks[0])
    cache.give(4 * KIB, blocks[1])
    with pytest.raises(RuntimeError, match="block 0"):
        cache.give(4 * KIB, blocks[2])
    assert cache.held_bytes == 8 * KIB
    assert {cache.take(4 * KIB)[0].number, cache.take(4 * KIB)[0].number} == {1, 2}


def test_a_cap_below_one_block_is_refused():
    with pytest.raises(ValueError, match="cannot hold one block"):
        DeviceCache(Device().allocate, Device().release, cap_bytes=DEVICE_CACHE_BLOCK_BYTES - 1)


#: A step: take a block of this many bytes (an int), or give back the outstanding block at this index (a str).
steps = st.lists(
    st.one_of(
        st.integers(min_value=0, max_value=DEVICE_CACHE_BLOCK_BYTES),
        st.integers(min_value=0, max_value=50).map(str),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from([DEVICE_CACHE_BLOCK_BYTES, 2 * DEVICE_CACHE_BLOCK_BYTES, DEVICE_CACHE_CAP_BYTES]))
def test_any_sequence_of_takes_and_gives_keeps_the_books(steps, cap):
    """Whatever the sizes and order: a block is never handed out twice or freed twice, a take gets at
    least what it asked, a reused block was given back, the cache stays within its cap and holds exactly
    the kept blocks' bytes, and once all are given back close() has freed every block ever made."""
    device = Device()
    cache = device.cache(cap_bytes=cap)
    out: list[tuple[int, Block]] = []  # (bytes asked, block) in the caller's hands
    given: set[int] = set()  # blocks given back and not taken since
    for step in steps:
        if isinstance(step, int):
            block, reused = cache.take(step)
            assert block.nbytes >= step and block.nbytes == size_class(step)
            assert all(block is not b for _, b in out)
            assert block not in device.released
            assert reused == (block.number in given)
            given.discard(block.number)
            out.append((step, block))
        elif out:
            nbytes, block = out.pop(int(step) % len(out))
            cache.give(nbytes, block)
            given.add(block.number)
        freed = {b.number for b in device.released}
        given -= freed
        assert cache.held_bytes <= cap
        assert cache.held_bytes == sum(device.made[n].nbytes for n in given)
    for nbytes, block in out:
        cache.give(nbytes, block)
    cache.close()
    assert sorted(b.number for b in device.released) == list(range(len(device.made)))
    assert cache.held_bytes == 0


def test_an_adopted_buffer_dropped_from_its_slot_is_freed_once_and_not_again_at_close():
    """A kernel file's launch process adopts each job's input memory (page-locked where it lies): the last job's
    must be unlocked when the next one's comes, not kept, locked, until the process ends."""
    import numpy as np

    from mmd.cuda.pools import PinnedPool

    freed: list[str] = []
    pool = PinnedPool(lambda nbytes: np.empty(nbytes, np.uint8), lambda buf: freed.append("pool's own"))
    first, second = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    pool.adopt("input", first, lambda: freed.append("first"))
    pool.drop("input")
    assert freed == ["first"] and not pool.holds(first)
    pool.adopt("input", second, lambda: freed.append("second"))
    pool.drop("other")  # a slot with nothing in it: nothing to do
    pool.free_all()
    assert freed == ["first", "second"]
