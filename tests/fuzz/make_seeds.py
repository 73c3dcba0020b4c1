#!/usr/bin/env python3
"""Write the seed corpus of tests/fuzz/fuzz_table.c (tests/fuzz/corpus/table/).

Each seed is a small scenario in the harness's byte language: four
configuration bytes (page size index, pages, staging pages, flags), then
operations (opcode % 9, then its argument bytes). Run from the repository
root; the files are committed, so this only needs rerunning when the byte
language changes.
"""
import os

CREATE, APPEND, TRUNCATE, FORK, RELEASE, ATTACH, ENGINE, MISC = 0, 1, 3, 4, 5, 6, 7, 8
P_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 8: 4, 16: 5}


def config(page_size, pages, staging, cache=True, collide=False, mask=0):
    flags = (1 if cache else 0) | (2 if collide else 0) | (mask << 6)
    return bytes([P_INDEX[page_size], pages - 1, staging, flags])


def create(prio=2):
    return bytes([CREATE, prio])


def append(seq, n, tokens=None, null_tokens=False):
    tokens = tokens if tokens is not None else [i % 8 for i in range(n)]
    return bytes([APPEND, seq, n | (64 if null_tokens else 0)] + tokens[:n])


def truncate(seq, length):
    return bytes([TRUNCATE, seq, length])


def fork(seq):
    return bytes([FORK, seq])


def release(seq):
    return bytes([RELEASE, seq])


def attach(prompt_len, create_arg=2):
    return bytes([ATTACH, prompt_len, create_arg])


def engine(arg):
    return bytes([ENGINE, arg])


def misc(kind, arg):
    return bytes([MISC, kind, arg])


def lifecycle():
    return (create() + append(0, 10) + fork(0) + append(1, 3) + truncate(0, 5)
            + append(0, 6) + release(0) + attach(12) + append(2, 4) + release(1))


SEEDS = {
    "paged-lifecycle": config(4, 16, 0) + lifecycle(),
    "staged-lifecycle": config(4, 16, 4) + lifecycle(),
    "page1-collisions": config(1, 12, 0, collide=True) + lifecycle() + attach(9) + attach(9),
    "staged-odd-page": config(3, 20, 5, collide=True, mask=1) + lifecycle() + truncate(0, 4),
    "pressure": (config(2, 4, 0) + create() + append(0, 6) + create() + append(1, 6)
                 + misc(4, 5) + append(1, 3) + engine(0) + engine(1) + release(0)
                 + attach(8) + misc(1, 3)),
    "alloc-failures": (config(4, 32, 0) + create() + misc(5, 0) + append(0, 12)
                       + misc(5, 1) + fork(0) + misc(5, 0) + attach(16) + misc(4, 9)),
    "priorities-eviction": (config(2, 6, 0) + create() + append(0, 6) + misc(3, 5)
                            + misc(2, 7) + release(0) + create() + append(0, 6, [7] * 6)
                            + release(0) + engine(0) + engine(0) + misc(1, 3) + attach(6)),
    "stale-ids": (config(4, 8, 2) + create() + release(0) + misc(0, 1) + misc(8, 0)
                  + create() + append(0, 5, null_tokens=True) + truncate(0, 9)),
    "no-cache": config(16, 8, 0, cache=False) + lifecycle() + append(0, 40),
}

if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "table")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {out}")
