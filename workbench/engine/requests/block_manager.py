"""The paged KV cache's bookkeeping: which fixed-size blocks each sequence owns.

The KV tensors themselves live in the model runner; this module only hands out block ids.
- Block tables: a sequence's token at position p lives in block `block_table[p // block_size]`,
  slot `p % block_size`.
- Prefix caching: a full block is named by a hash chained over every token before it (plus the
  request's cache salt and adapter). A new sequence reuses the longest chain of cached blocks;
  freed blocks keep their hash and are evicted least-recently-freed first. Blocks of a prompt
  given as embeddings are never cached (its token ids are placeholders), nor those of a request
  that stops before the last layer (`stop_at_layer`: the later layers' KV is not written).
- Copy-on-write: forked sequences (n > 1, beams) share blocks by reference count; a sequence about
  to write into a shared, partly filled block gets its own copy first (returned as `(src, dst)`).
- Sliding windows: where every layer of the model attends to at most the last W positions,
  the blocks a sequence will never read again are released as it goes (`release_before`);
  their places in its block table hold `RELEASED`.
Torch-free; unit-tested without a model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from workbench.engine.requests.request import Sequence

RELEASED = -1  # a block table entry whose block was released (out of every layer's window)


class NoFreeBlocksError(RuntimeError):
    """The cache has no block left for a sequence; the scheduler preempts someone."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and computed


class BlockManager:
    """Hands out KV blocks to sequences; see the module docstring.

    >>> bm = BlockManager(num_blocks=4, block_size=2)
    >>> bm.num_free_blocks
    4
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # hash -> block id
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (cached free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks `seq` needs to hold `num_new_tokens` more computed tokens."""
        total = seq.num_computed_tokens + num_new_tokens
        needed = -(-total // self.block_size) - len(seq.block_table)
        if self._needs_copy(seq):
            needed += 1
        return max(needed, 0)

    def can_reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    # -- prefix cache ----------------------------------------------------------------------
    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Chained hashes of the first `num_blocks` full blocks of `seq`'s tokens."""
        req = seq.request
        salt = (req.cache_salt, getattr(req.lora_request, "lora_int_id", None),
                req.interventions_key)
        hashes, parent = [], hash(salt)
        bs = self.block_size
        for i in range(num_blocks):
            parent = hash((parent, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
            hashes.append(parent)
        return hashes

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """Gives a sequence without blocks the cached blocks of its longest known prefix.

        Returns the number of tokens whose KV is thereby already computed. At least one token
        is always left to compute, so the step that finishes the prompt has logits.
        """
        assert not seq.block_table
        req = seq.request
        if (not self.enable_prefix_caching or req.params.prompt_logprobs is not None
                or req.prompt_embeds is not None  # embeddings: placeholder ids, never shared
                or req.recording is not None):  # its activations: every position computed
            return 0
        max_blocks = (len(seq.token_ids) - 1) // self.block_size
        self.prefix_queries += max_blocks
        for h in self.block_hashes(seq, max_blocks):
            block_id = self._cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        self.prefix_hits += len(seq.block_table)
        seq.num_computed_tokens = len(seq.block_table) * self.block_size
        return seq.num_computed_tokens

    def commit(self, seq: Sequence) -> None:
        """Registers the blocks that `seq` has just filled with computed tokens (not those of a
        request whose forward stops early: its later layers' KV is never written)."""
        req = seq.request
        if (not self.enable_prefix_caching or req.prompt_embeds is not None
                or req.stop_at_layer is not None):
            return
        num_full = seq.num_computed_tokens // self.block_size
        first_unhashed = next(
            (i for i in range(num_full) if seq.block_table[i] != RELEASED
             and self.blocks[seq.block_table[i]].hash is None), num_full
        )
        if first_unhashed == num_full:
            return
        hashes = self.block_hashes(seq, num_full)
        for i in range(first_unhashed, num_full):
            if seq.block_table[i] == RELEASED:
                continue
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and hashes[i] not in self._cached:
                block.hash = hashes[i]
                self._cached[hashes[i]] = block.block_id

    def reset_prefix_cache(self) -> None:
        """Forgets every cached block that no live sequence holds."""
        for block_id in self._free:
            self._drop_hash(self.blocks[block_id])

    # -- allocation ------------------------------------------------------------------------
    def reserve(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Makes room for `num_new_tokens` more tokens; returns the block copies to perform."""
        if not self.can_reserve(seq, num_new_tokens):
            raise NoFreeBlocksError(seq.seq_id)
        copies = []
        if self._needs_copy(seq):
            last = seq.num_computed_tokens // self.block_size
            src = self.blocks[seq.block_table[last]]
            dst = self._take_free_block()
            src.ref_count -= 1
            seq.block_table[last] = dst.block_id
            copies.append((src.block_id, dst.block_id))
        total = seq.num_computed_tokens + num_new_tokens
        while len(seq.block_table) * self.block_size < total:
            seq.block_table.append(self._take_free_block().block_id)
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` shares every block of `parent` (its block table is a copy of the parent's)."""
        child.block_table = list(parent.block_table)
        for block_id in child.block_table:
            if block_id != RELEASED:
                self.blocks[block_id].ref_count += 1

    def free(self, seq: Sequence) -> None:
        """Releases `seq`'s blocks; blocks nobody holds become free (keeping their hash)."""
        for block_id in reversed(seq.block_table):
            if block_id != RELEASED:
                self._release(block_id)
        seq.block_table = []

    def release_before(self, seq: Sequence, position: int) -> int:
        """Releases `seq`'s blocks that hold only positions before `position` (it will never read
        them again: they are out of every layer's window); returns how many."""
        released = 0
        for i in range(min(position // self.block_size, len(seq.block_table))):
            if seq.block_table[i] != RELEASED:
                self._release(seq.block_table[i])
                seq.block_table[i] = RELEASED
                released += 1
        return released

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None

    # -- internals -------------------------------------------------------------------------
    def _needs_copy(self, seq: Sequence) -> bool:
        """True when the next token goes into a block that another sequence also holds."""
        last = seq.num_computed_tokens // self.block_size
        if last >= len(seq.block_table):
            return False
        return self.blocks[seq.block_table[last]].ref_count > 1

    def _take_free_block(self) -> Block:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        self._drop_hash(block)
        block.ref_count = 1
        return block

    def _drop_hash(self, block: Block) -> None:
        if block.hash is not None:
            if self._cached.get(block.hash) == block.block_id:
                del self._cached[block.hash]
            block.hash = None
