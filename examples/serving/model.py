"""The toy model: a language model whose KV cache matters.

Each prompt token's KV entry (one per KV-cache group) is a hash of the entry
before it and the token, so an entry depends on every token so far. Each
generated token is a hash of the whole KV cache (every entry of every group,
with its position), so decoding from a wrong, missing, stale or freed block
gives different tokens, with overwhelming probability. `generate` runs the
same model in one process: it is the reference the checker compares every
answer with.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

MASK = (1 << 64) - 1
VOCAB = 32_000
# Two KV-cache groups, like a hybrid model's full-attention and
# sliding-window layers in vLLM: the handoff then names one list of block
# IDs per group.
GROUPS = 2
# KV entries (tokens) per block.
BLOCK_SIZE = 4

KV = list[list[int]]  # one list of entries per group


def _mix(a: int, b: int) -> int:
    """splitmix64 of a combined with b: cheap, and every input bit matters."""
    z = (a ^ ((b * 0x9E3779B97F4A7C15) & MASK)) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _seed(group: int) -> int:
    return _mix(0x5EED, group + 1)


def prefill(tokens: list[int]) -> KV:
    """The prompt's KV cache: one entry per token in each group."""
    kv: KV = []
    for g in range(GROUPS):
        state = _seed(g)
        entries = []
        for tok in tokens:
            state = _mix(state, tok)
            entries.append(state)
        kv.append(entries)
    return kv


def extend(kv: KV, token: int) -> None:
    """Appends a generated token's KV entries (decode step)."""
    for g, entries in enumerate(kv):
        entries.append(_mix(entries[-1] if entries else _seed(g), token))


def next_token(kv: KV) -> int:
    """The next token: a function of every entry of the cache."""
    h = 0
    for g, entries in enumerate(kv):
        for pos, entry in enumerate(entries):
            h = _mix(h, entry ^ (pos << 8) ^ g)
    return h % VOCAB


def decode(kv: KV, first: int, max_tokens: int, stop: list[int]) -> tuple[list[int], str]:
    """Continues from the prompt's KV cache and the prefill's first token.

    Returns every generated token (the first included) and the finish reason.
    Mutates kv."""
    out = [first]
    while True:
        if out[-1] in stop:
            return out, "stop"
        if len(out) >= max_tokens:
            return out, "length"
        extend(kv, out[-1])
        out.append(next_token(kv))


def generate(prompt: list[int], max_tokens: int, stop: list[int]) -> tuple[list[int], str]:
    """The reference: prefill and decode in one process."""
    kv = prefill(prompt)
    return decode(kv, next_token(kv), max_tokens, stop)


def to_blocks(entries: list[int]) -> list[list[int]]:
    """A group's entries cut into blocks of BLOCK_SIZE (the last one partial)."""
    return [entries[i : i + BLOCK_SIZE] for i in range(0, len(entries), BLOCK_SIZE)]


def blocks_needed(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK_SIZE)
