#!/usr/bin/env python3
"""Reading a callgrind file per message: who calls a function, what it
calls, and which of its instructions run.

    scripts/callgrind.py callers FILE REGEX [PER]
    scripts/callgrind.py callees FILE REGEX [PER]
    scripts/callgrind.py instructions FILE FUNCTION BINARY [PER]

FILE is a callgrind output (`scripts/instructions.sh` leaves one in
target/profile/). Costs are divided by PER (default 3000, the results
instructions.sh sends; use the decision count for a `DECIDE_ITERS` run of
the core bench).

- `callers`: for each function matching REGEX, its callers one level up,
  with the instructions spent in it from each and the calls per message.
- `callees`: for each function matching REGEX, what it calls, inclusive.
- `instructions`: the own instructions of FUNCTION (its exact name), per
  machine instruction, joined with `objdump -d` of BINARY. Needs a file
  recorded with `valgrind --tool=callgrind --dump-instr=yes
  --dump-line=no`. How often each instruction ran says which loop body
  a cost is in: this found a stall on words compared through the stack,
  and a 656-byte temporary copied three times per decision.

Uses callgrind_annotate and objdump (Debian's valgrind and binutils).
"""

import collections
import re
import signal
import subprocess
import sys

COST = r"\s*([\d,]+) \([^)]*\)\s+"


def number(text):
    return int(text.replace(",", ""))


def blocks(path, tree):
    """callgrind_annotate's call tree: one block per function."""
    out = subprocess.run(
        ["callgrind_annotate", f"--tree={tree}", "--threshold=100", "--inclusive=yes", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for block in out.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        own = [line for line in lines if re.match(COST + r"\*", line)]
        if own:
            yield own[0], lines


def tree(path, pattern, per, tree_kind, arrow):
    for own, lines in blocks(path, tree_kind):
        name = re.sub(r"\s*\[.*\]$", "", own.split("*", 1)[1]).strip()
        if not re.search(pattern, name):
            continue
        print(f"== {number(own.split()[0]) / per:.0f}/msg  {name[:150]}")
        for line in lines:
            m = re.match(COST + arrow + r"\s+(.+?) \(([\d,]+)x\)", line)
            if m and number(m.group(1)) / per >= 5:
                calls = number(m.group(3)) / per
                print(f"  {number(m.group(1)) / per:8.0f}/msg  {calls:6.2f} calls/msg  {m.group(2)[:130]}")


def instructions(path, function, binary, per):
    names, counts = {}, collections.Counter()
    current, address, call_line = "", 0, False
    with open(path) as f:
        for line in f:
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3)
                if m.group(1) == "fn":
                    current = names.get(m.group(2), "")
                continue
            if line.startswith("calls="):
                # The next cost line is the call's, inclusive: not this
                # function's own.
                call_line = True
                continue
            # A cost line: the instruction's address (absolute, relative
            # to the last one, or the same), then the source line when
            # recorded, then the cost.
            fields = line.split()
            if not fields or not re.fullmatch(r"0x[0-9a-f]+|[+-]\d+|\*", fields[0]):
                continue
            position = fields[0]
            if position.startswith("0x"):
                address = int(position, 16)
            elif position[0] in "+-":
                address += int(position)
            if call_line:
                call_line = False
                continue
            if len(fields) >= 2 and current == function:
                counts[address] += int(fields[-1])
    if not counts:
        sys.exit(f"no own instructions of {function!r} in {path} (recorded with --dump-instr=yes --dump-line=no?)")
    print(f"{function}: {sum(counts.values()) / per:.0f} own instructions per message")
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C",
         f"--start-address={min(counts)}", f"--stop-address={max(counts) + 16}", binary],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in listing.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
        if m:
            ran = counts.get(int(m.group(1), 16), 0) / per
            shown = f"{ran:8.1f}" if ran else " " * 8
            print(f"{shown}  {m.group(1)}  {m.group(2)[:100]}")


def main(args):
    # Quiet when piped into `head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    usage = __doc__.split("\n\n")[1]
    if len(args) < 3:
        sys.exit(usage)
    command, path = args[0], args[1]
    if command in ("callers", "callees") and len(args) in (3, 4):
        per = float(args[3]) if len(args) == 4 else 3000.0
        kind, arrow = ("caller", "<") if command == "callers" else ("calling", ">")
        tree(path, args[2], per, kind, arrow)
    elif command == "instructions" and len(args) in (4, 5):
        per = float(args[4]) if len(args) == 5 else 3000.0
        instructions(path, args[2], args[3], per)
    else:
        sys.exit(usage)


if __name__ == "__main__":
    main(sys.argv[1:])
