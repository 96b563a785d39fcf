"""Paged KV-cache bookkeeping: which physical block holds which sequence's tokens. Pure Python, no arrays.

- The cache is `num_blocks` blocks of `block_size` token slots; a sequence's `block_table` lists its
  blocks in order, so token position p lives in slot `block_table[p // block_size] * block_size + p %
  block_size`.
- Blocks carry reference counts. The n samples of one prompt share the prompt's blocks (`fork`); a
  sequence about to write into a block it shares first copies it (copy-on-write: `append_slots` returns
  the (src, dst) pairs, which the model runner copies before the step's forward pass).
- Prefix caching: once a full block's keys and values are computed, it is registered under the chained
  key (hash of the previous block's key, its tokens), so equal prefixes (a shared system prompt, a
  preempted sequence coming back) find their blocks instead of recomputing them. The dict compares the
  block's own tokens, so only a collision of the 64-bit previous-block hash could mismatch.
  Freed blocks keep their contents and key and go to the back of the free queue: they are reused only
  when the queue reaches them (least recently freed first), and a lookup can revive them before that.
  A lookup never covers a prompt's last token: its logits are needed, so it is always recomputed, and a
  shared cached block is never written.
"""

from __future__ import annotations

from collections import OrderedDict

from barerl.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "hash", "key", "ref_count")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.key: tuple | None = None  # (previous block's hash, this block's tokens) once registered
        self.hash: int | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.cached_block_ids: dict[int, int] = {}  # block hash -> block id

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _block_key(self, tokens: list[int], start: int, prev_hash: int | None) -> tuple:
        """The prefix-cache key of the block of `tokens` from position `start` (module docstring)."""
        return prev_hash, tuple(tokens[start : start + self.block_size])

    # ------------------------------------------------------------------------------------------ admission

    def lookup(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of seq's tokens (full blocks, never its last token)."""
        hits: list[int] = []
        if not self.enable_prefix_caching:
            return hits
        tokens, size = seq.token_ids, self.block_size
        limit, prev_hash = (len(tokens) - 1) // size * size, None
        for block_id, key in seq.prefix_hint:  # still cached under the very key a sequence of our prefix left
            block = self.blocks[block_id]
            if len(hits) * size >= limit or block.key is not key:
                break
            hits.append(block_id)
            prev_hash = block.hash
        for start in range(len(hits) * size, limit, size):
            key = self._block_key(tokens, start, prev_hash)
            key_hash = hash(key)  # a tuple's hash is not cached: computed once per block
            block_id = self.cached_block_ids.get(key_hash)
            if block_id is None or self.blocks[block_id].key != key:
                break
            hits.append(block_id)
            prev_hash = key_hash
        return hits

    def can_allocate(self, seq: Sequence, hits: list[int]) -> bool:
        num_new = self.num_blocks_for(seq.num_tokens) - len(hits)
        num_revived = sum(self.blocks[b].ref_count == 0 for b in hits)  # cached but sitting in the free queue
        return num_new + num_revived <= self.num_free_blocks

    def allocate(self, seq: Sequence, hits: list[int]) -> None:
        """Give a waiting sequence blocks for all its tokens, the cached prefix `hits` included."""
        assert not seq.block_table, seq
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)
        while len(seq.block_table) < self.num_blocks_for(seq.num_tokens):
            seq.block_table.append(self._take_free_block())
        seq.num_computed_tokens = len(hits) * self.block_size

    def _take_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.cached_block_ids.get(block.hash) == block_id:
            del self.cached_block_ids[block.hash]  # evicted: its contents are about to be overwritten
        block.key = block.hash = None
        block.ref_count = 1
        return block_id

    # ------------------------------------------------------------------------------------------- running

    def _shared_block_index(self, seq: Sequence) -> int | None:
        """Index in the block table of the block the next token goes into, if other sequences share it."""
        i = seq.num_computed_tokens // self.block_size
        if i < len(seq.block_table) and self.blocks[seq.block_table[i]].ref_count > 1:
            return i
        return None

    def num_blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        end = seq.num_computed_tokens + num_new_tokens
        num_copies = self._shared_block_index(seq) is not None
        return max(0, self.num_blocks_for(end) - len(seq.block_table)) + num_copies

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_to_append(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make room for seq's next tokens; returns the (src, dst) block copies copy-on-write needs."""
        copies = []
        i = self._shared_block_index(seq)
        if i is not None:
            src = seq.block_table[i]
            self.blocks[src].ref_count -= 1
            seq.block_table[i] = self._take_free_block()
            copies.append((src, seq.block_table[i]))
        while len(seq.block_table) < self.num_blocks_for(seq.num_computed_tokens + num_new_tokens):
            seq.block_table.append(self._take_free_block())
        return copies

    def fork(self, child: Sequence) -> None:
        """`child` was forked from a parent with the same block table: share its blocks."""
        for block_id in child.block_table:
            self.blocks[block_id].ref_count += 1

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's newly computed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // self.block_size):
            prev_hash = seq.block_hashes[-1] if seq.block_hashes else None
            key = self._block_key(seq.token_ids, i * self.block_size, prev_hash)
            key_hash = hash(key)
            seq.block_hashes.append(key_hash)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and key_hash not in self.cached_block_ids:
                block.key, block.hash = key, key_hash
                self.cached_block_ids[key_hash] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first so that a prefix's head stays cached longest; seq keeps the cached ones'
        ids and keys (`released_blocks`) for a sequence that continues it."""
        released = []
        for block_id in seq.block_table:
            key = self.blocks[block_id].key
            if key is None:
                break
            released.append((block_id, key))
        seq.released_blocks = released
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table, seq.block_hashes = [], []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (the weights changed, or the cache memory was released)."""
        self.cached_block_ids.clear()
        for block in self.blocks:
            block.key = block.hash = None
