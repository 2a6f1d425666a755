"""A prefill engine's KV pool: a fixed number of fixed-size blocks.

Like a paged KV cache (vLLM's block pool, TensorRT-LLM's KV cache manager):
blocks come from a free list and go back to it. Every allocation of a block
gets a new generation number, so an event naming (block, generation) says
which allocation it was about even after the block was reused; the checker
relies on that. A freed block's contents are overwritten with a poison
value, so a read of a freed block yields entries that give wrong tokens
(a real engine leaves them to the next owner, which is no better).

The pool itself does not refuse a second free of the same allocation: a
real allocator does not either (it would hand the block to two owners).
Keeping each block freed once is the engine's job, and the checker's to
verify.
"""

from __future__ import annotations

from collections import deque

from model import BLOCK_SIZE

POISON = 0xDEAD_BEEF_DEAD_BEEF


class PoolFull(Exception):
    pass


class Pool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.data: list[list[int]] = [[POISON] * BLOCK_SIZE for _ in range(num_blocks)]
        self.gen = [0] * num_blocks
        self.free_list: deque[int] = deque(range(num_blocks))

    @property
    def free_count(self) -> int:
        return len(self.free_list)

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free_list):
            raise PoolFull(f"{n} blocks wanted, {len(self.free_list)} free")
        ids = [self.free_list.popleft() for _ in range(n)]
        for b in ids:
            self.gen[b] += 1
        return ids

    def write(self, block: int, entries: list[int]) -> None:
        self.data[block] = list(entries) + [POISON] * (BLOCK_SIZE - len(entries))

    def free(self, ids: list[int]) -> None:
        for b in ids:
            self.data[b] = [POISON] * BLOCK_SIZE
            self.free_list.append(b)
