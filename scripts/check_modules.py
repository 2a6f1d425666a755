#!/usr/bin/env python3
"""Import cycles between the entries of each folder of a crate's src/.

    scripts/check_modules.py [--quiet] [SRC]

For every folder of SRC (default src/, itself included) the nodes are the
folder's entries, its files and subfolders, each taken whole. `A -> B` says
code under A names a path into B: a `use` or a `crate::`, `super::` or
`self::` path. A folder's mod.rs (lib.rs for SRC) is the parent of its
entries, not one of them; a name it re-exports from a child is the child's.
Prints each folder's edges and where each first comes from (--quiet: only
the cycles); exits 1 on a cycle.
"""

import os
import re
import sys

# Comments, string and char literals: spaced out (lines kept) before paths are read.
NOISE = re.compile(r"//[^\n]*|/\*.*?\*/|b?r(#*)\".*?\"\1|b?\"(?:\\.|[^\"\\])*\""
                   r"|b?'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'", re.S)
PATH = re.compile(r"(?<![\w:])(crate|super|self)((?:\s*::\s*\w+)+)")


def use_paths(tree):
    """`a::{self, b::{c, d as e}}` gives a, a::b::c and a::b::d (and a::b)."""
    paths, stack, last = [], [()], ()
    for token in re.findall(r"[{},]|[^{},]+", re.sub(r"\s+as\s+\w+|\s+", "", tree)):
        if token == "{":
            stack.append(last)
        elif token == "}":
            stack.pop()
        elif token != ",":
            last = stack[-1] + tuple(s for s in token.split("::") if s)
            paths.append(last[:-1] if last[-1:] in (("self",), ("*",)) else last)
    return paths


class Crate:
    def __init__(self, root):
        self.root, self.files = root, {}  # module path -> file
        for folder, _, names in os.walk(root):
            for name in (n for n in names if n.endswith(".rs") and n != "main.rs"):
                rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
                module = () if rel == ["lib"] else tuple(rel[:-1] if rel[-1] == "mod" else rel)
                self.files[module] = os.path.join(folder, name)
        self.code = {m: NOISE.sub(lambda n: re.sub(r"[^\n]", " ", n.group(0)),
                                  open(f, encoding="utf-8").read())
                     for m, f in self.files.items()}
        self.reexports = {m: {} for m in self.files}  # name -> where it is defined
        for m, code in self.code.items():
            for use in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", code):
                for path in use_paths(use.group(1)):
                    full = self.absolute(m, path)
                    if full and full[: len(m)] == m and len(full) > len(m):
                        self.reexports[m][full[-1]] = full

    def absolute(self, scope, segs):
        """A path written in `scope`, from the crate's root; None outside it."""
        if segs[:1] in (("crate",), ("self",)):
            return (() if segs[0] == "crate" else scope) + segs[1:]
        up = next((i for i, s in enumerate(segs) if s != "super"), len(segs))
        if up:
            return scope[: len(scope) - up] + segs[up:] if up <= len(scope) else None
        return scope + segs if segs and scope + segs[:1] in self.files else None

    def target(self, path):
        """The module (file) a path lands in, through parents' re-exports."""
        module = ()
        for i, seg in enumerate(path):
            if module + (seg,) in self.files:
                module += (seg,)
            elif self.reexports[module].get(seg, path) != path:
                return self.target(self.reexports[module][seg] + path[i + 1:])
            else:
                break
        return module

    def references(self, module):
        """(module named, line) for every path into the crate in `module`."""
        code = self.code[module]
        inline = []  # (start, end, name) of each `mod name { .. }`
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
            depth, end = 0, m.end() - 1
            while end < len(code) and (depth := depth + {"{": 1, "}": -1}.get(code[end], 0)):
                end += 1
            inline.append((m.start(), end, m.group(1)))

        def scope(at):
            return module + tuple(n for s, e, n in sorted(inline) if s <= at <= e)

        uses = [(m.start(), m.end(), m.group(1)) for m in re.finditer(r"\buse\s+([^;]+);", code)]
        found = [(self.absolute(scope(s), p), s) for s, _, tree in uses for p in use_paths(tree)]
        for m in PATH.finditer(code):
            if not any(s <= m.start() < e for s, e, _ in uses):
                segs = (m.group(1),) + tuple(x.strip() for x in m.group(2).split("::")[1:])
                found.append((self.absolute(scope(m.start()), segs), m.start()))
        return [(self.target(p), code.count("\n", 0, at) + 1) for p, at in found if p is not None]


def folder_graphs(crate):
    """folder -> {(a, b): "file:line"}: the edges between its entries."""
    graphs = {}
    for module in sorted(crate.files):
        for target, line in crate.references(module):
            c = next((i for i, (x, y) in enumerate(zip(module, target)) if x != y), None)
            if c is None:
                continue  # one inside the other: parent and child, or one file
            folder = os.path.join(crate.root, *module[:c])
            where = "%s:%d" % (crate.files[module], line)
            graphs.setdefault(folder, {}).setdefault((module[c], target[c]), where)
    return graphs


def cycles(edges):
    """The sets of two or more entries that all reach one another."""
    def reach(a, seen):
        for b in (b for x, b in edges if x == a and b not in seen):
            seen.add(b)
            reach(b, seen)
        return seen

    reaches = {a: reach(a, set()) for a, _ in edges}
    found = {frozenset({a} | {b for b in r if a in reaches.get(b, ())}) for a, r in reaches.items()}
    return sorted(sorted(c) for c in found if len(c) > 1)


def main(argv):
    quiet, found = "--quiet" in argv, 0
    root = next((a for a in argv if not a.startswith("--")), "src")
    for folder, edges in sorted(folder_graphs(Crate(root)).items()):
        loops = cycles(edges)
        found += len(loops)
        if loops or not quiet:
            print(folder + "/")
        for (a, b), where in [] if quiet else sorted(edges.items()):
            print("  %s -> %s  (%s)" % (a, b, where))
        for loop in loops:
            print("  CYCLE: " + " <-> ".join(loop))
            for (a, b), where in sorted(edges.items()):
                if a in loop and b in loop:
                    print("      %s -> %s  (%s)" % (a, b, where))
    if found:  # to stderr, exit status 1
        sys.exit("check-modules: %d import cycle(s) between the entries of a folder" % found)
    print("check-modules: no import cycle")


if __name__ == "__main__":
    main(sys.argv[1:])
