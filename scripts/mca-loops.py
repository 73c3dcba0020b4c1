#!/usr/bin/env python3
"""Throughput of the attention kernels' inner loops from their instruction
mix (llvm-mca), for CPUs this project cannot run on.

    scripts/mca-loops.py OBJ CPU FUNCTION[:WORK] ...

(llvm-mca: $LLVM_MCA or the newest /usr/lib/llvm-*/bin/llvm-mca; Debian's
llvm-19 package has the Neoverse N1 / V1 models.)

For each function of the object file OBJ (the NEON or AVX-512 kernels
built by `make`), the hottest loop is taken as the largest innermost loop:
the instructions from a backward branch's target to the branch, with no
other backward branch inside. Its branches are dropped and the rest goes
to `llvm-mca -mcpu=CPU`; the line printed is the block's reciprocal
throughput in cycles per iteration and, where WORK (the multiply-adds of
(token, channel, row) one iteration does) is given, cycles per 1,000
of them. Paths inside the loop that a full chunk does not take (a partial
chunk's copy) are counted too, so the figures are upper bounds.
"""
import glob
import os
import re
import subprocess
import sys


def llvm_mca():
    """$LLVM_MCA, else the newest llvm-mca installed (its CPU models matter:
    LLVM 14 models the Cortex-A76 as a Cortex-A57)."""
    if os.environ.get("LLVM_MCA"):
        return os.environ["LLVM_MCA"]
    found = glob.glob("/usr/lib/llvm-*/bin/llvm-mca")
    found.sort(key=lambda p: int(re.search(r"llvm-(\d+)", p).group(1)))
    return found[-1] if found else "llvm-mca"


def disasm(obj, func):
    tool = "aarch64-linux-gnu-objdump" if "arm64" in obj or "aarch64" in obj else "objdump"
    out = subprocess.run([tool, "-d", "--no-show-raw-insn", "--disassemble=" + func, obj],
                         capture_output=True, text=True, check=True).stdout
    insns = []
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2).split("//")[0].split("#", 1)[0].strip()
                          if False else m.group(2).split("//")[0].strip()))
    return insns


BRANCH = re.compile(r"^(b\.\w+|b|cbz|cbnz|tbz|tbnz|j\w+|jmp)\s+.*?([0-9a-f]+)\s*<")


def hottest_loop(insns):
    loops = []
    for i, (addr, text) in enumerate(insns):
        m = BRANCH.match(text)
        if not m:
            continue
        target = int(m.group(2), 16)
        if target <= addr:
            j = next(k for k, (a, _) in enumerate(insns) if a >= target)
            loops.append((j, i))
    inner = [(s, e) for (s, e) in loops
             if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for (s2, e2) in loops)]
    if not inner:
        return []
    s, e = max(inner, key=lambda l: l[1] - l[0])
    body = []
    for _, text in insns[s:e + 1]:
        if BRANCH.match(text) or text.startswith(("bl ", "call", "ret", "nop")):
            continue
        body.append(re.sub(r"\s+<[^>]*>", "", text))
    return body


def main():
    obj, cpu = sys.argv[1], sys.argv[2]
    triple = "aarch64" if "arm64" in obj or "aarch64" in obj else "x86_64"
    for spec in sys.argv[3:]:
        func, _, work = spec.partition(":")
        body = hottest_loop(disasm(obj, func))
        if not body:
            print(f"{func}: no loop found")
            continue
        asm = "\n".join(body) + "\n"
        if triple == "x86_64":
            asm = ".att_syntax\n" + asm
        res = subprocess.run([llvm_mca(), "-mtriple=" + triple, "-mcpu=" + cpu, "-iterations=200"],
                             input=asm, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{func}: llvm-mca failed: {res.stderr.strip().splitlines()[:2]}")
            continue
        rt = float(re.search(r"Block RThroughput:\s*([0-9.]+)", res.stdout).group(1))
        line = f"{func}: {len(body)} instructions, {rt:.2f} cycles per iteration"
        if work:
            line += f", {1000 * rt / float(work):.1f} cycles per 1000 multiply-adds"
        print(line)


if __name__ == "__main__":
    main()
