#!/usr/bin/env python3
"""The import graph of src/, folder by folder, and its cycles.

    scripts/module_graph.py [--allow FILE] [--quiet | --evidence] [--max-lines N]
    scripts/module_graph.py --long-functions N

For every folder of src/ (src/ itself included) the graph's nodes are the
folder's entries: its files and its subfolders, each taken whole. An edge
`A -> B` says that code under A names a path into B: a `use` of it, or a
`crate::`/`super::`/`self::` path in the code (comments and strings are
skipped; an inline `mod tests { .. }` counts as its file's). At src/ this is
the graph between top-level modules; in src/identity/ the one between
identity's files.

A folder's `mod.rs` (and src/lib.rs for src/) is the parent of its entries,
not one of them: it declares its children and may use them, and a child may
use what the parent defines. A name the parent re-exports from one of its
own children (`pub use claim::Settings;`) counts as the child's. What must
not happen is a cycle among the entries of one folder: then neither side
can be read, tested or moved without the other.

--allow FILE lists edges that are known to close a cycle, one a line:

    src/identity: claim -> floor  # why it is still there

They are left out before cycles are looked for. An allowed edge that no
longer exists, or no longer closes a cycle, is an error too, so the list
only shrinks. --quiet prints the cycles only, --evidence also the first
place each edge comes from.

--long-functions N lists the functions longer than N lines, longest first,
with whether a comment at their head (doc comment, or the first lines of
the body) says why they are not split (it mentions "split"), and which are
tests. It only reports.

--max-lines N (with the graph) fails on a function longer than N lines
whose head gives no reason, as --long-functions N would mark it.

Exits 1 on a cycle that is not allowed, an allow line that is stale or
malformed, or (with --max-lines) an unexplained long function; 0 otherwise.
"""

import argparse
import os
import re
import sys

SRC = "src"


# --- Reading Rust: comments and literals blanked, positions kept -----------


def blank(text):
    """`text` with comments and the contents of string and char literals
    replaced by spaces (newlines kept), so that positions and line numbers
    stay those of the file and what is left is code."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and _raw_prefix(text, i):
            m = re.match(r'r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            wipe(i + 1, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}'), else a lifetime.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                wipe(i + 1, i + m.end() - 1)
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def _ident_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _raw_prefix(text, i):
    """Whether the `r` at `i` opens a raw string (`r"`, `br"`), not ends a name."""
    if text[i - 1 : i] == "b":
        i -= 1
    return not _ident_before(text, i)


def matching_brace(code, open_at):
    """The index of the `}` closing the `{` at `open_at` (in blanked code)."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def inline_mods(code):
    """(start, end, name) of every `mod name { .. }` in the file."""
    found = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
        found.append((m.start(), matching_brace(code, m.end() - 1), m.group(1)))
    return found


def use_paths(tree):
    """The paths a `use` tree names: `a::{self, b::{c, d as e}}` gives
    a, a::b::c, a::b::d (an alias is the name it stands for)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(t):
        parts, depth, cur = [], 0, ""
        for ch in t:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        return [p for p in parts + [cur] if p]

    def expand(prefix, t):
        paths = []
        for p in split_top(t):
            if "{" in p:
                head = [s for s in p[: p.index("{")].split("::") if s]
                paths += expand(prefix + head, p[p.index("{") + 1 : p.rindex("}")])
                continue
            segs = [s for s in p.split("::") if s]
            if segs in (["self"], ["*"]):
                paths.append(prefix)
            elif segs[-1] == "*":
                paths.append(prefix + segs[:-1])
            else:
                paths.append(prefix + segs)
        return paths

    return expand([], tree)


# --- The crate's files and modules -----------------------------------------


class Crate:
    def __init__(self, root):
        self.root = root
        self.files = {}  # module path (tuple) -> file path
        for dirpath, _, names in os.walk(root):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)[: -len(".rs")].split(os.sep)
                if rel in (["lib"], ["main"]):
                    if rel == ["lib"]:
                        self.files[()] = path
                    continue
                if rel[-1] == "mod":
                    rel = rel[:-1]
                self.files[tuple(rel)] = path
        self.code = {m: blank(open(p, encoding="utf-8").read()) for m, p in self.files.items()}
        self.reexports = {m: self._reexports(m) for m in self.files}

    def _reexports(self, module):
        """Names a module re-exports from below itself: name -> absolute path."""
        names = {}
        for m in re.finditer(r"\bpub(\([^)]*\))?\s+use\s+([^;]+);", self.code[module]):
            raw = m.group(2)
            for path in use_paths(raw):
                absolute = self.absolute(module, path)
                if absolute and absolute[: len(module)] == module and len(absolute) > len(module):
                    names[absolute[-1]] = absolute
            for alias in re.finditer(r"([\w:]+)\s+as\s+(\w+)", raw):
                absolute = self.absolute(module, alias.group(1).split("::"))
                if absolute and absolute[: len(module)] == module:
                    names[alias.group(2)] = absolute
        return names

    def absolute(self, module, segs):
        """A path as written in `module`, from the crate's root; None when it
        does not start at the crate (an external crate, std)."""
        segs = [s for s in segs if s]
        if not segs:
            return None
        if segs[0] in ("crate", "$crate"):
            return tuple(segs[1:])
        if segs[0] == "self":
            return module + tuple(segs[1:])
        if segs[0] == "super":
            up = 0
            while up < len(segs) and segs[up] == "super":
                up += 1
            if up > len(module):
                return None
            return module[: len(module) - up] + tuple(segs[up:])
        if module + (segs[0],) in self.files:
            # A child module named directly (`use claim::Settings` in mod.rs).
            return module + tuple(segs)
        return None

    def target(self, path, seen=None):
        """The module (file) an absolute path lands in, re-exports followed
        when a module re-exports from below itself."""
        seen = seen or set()
        module = ()
        for i, seg in enumerate(path):
            if module + (seg,) in self.files:
                module = module + (seg,)
                continue
            again = self.reexports.get(module, {}).get(seg)
            if again and again not in seen:
                seen.add(again)
                return self.target(again + tuple(path[i + 1 :]), seen)
            break
        return module

    def references(self, module):
        """(target module, line) of every path to the crate in a module."""
        code = self.code[module]
        mods = inline_mods(code)

        def scope(at):
            inner = [(s, name) for s, e, name in mods if s <= at <= e]
            return module + tuple(name for _, name in sorted(inner))

        def line(at):
            return code.count("\n", 0, at) + 1

        found = []
        uses = []
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            uses.append((m.start(), m.end()))
            for path in use_paths(m.group(1)):
                absolute = self.absolute(scope(m.start()), path)
                if absolute is not None:
                    found.append((self.target(absolute), line(m.start())))
        for m in re.finditer(r"(?<![\w:])(\$?crate|super|self)((\s*::\s*\w+)+)", code):
            if any(a <= m.start() < b for a, b in uses):
                continue
            segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::")]
            absolute = self.absolute(scope(m.start()), segs)
            if absolute is not None:
                found.append((self.target(absolute), line(m.start())))
        return found


# --- Graphs and cycles ------------------------------------------------------


def folder_graphs(crate):
    """folder name -> {(a, b): 'file:line'} of edges between its entries."""
    graphs = {}
    for module in sorted(crate.files):
        for target, line in crate.references(module):
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            if common == len(module) or common == len(target):
                continue  # parent and child, or within one entry
            folder = "/".join((SRC,) + module[:common])
            edge = (module[common], target[common])
            where = "%s:%d" % (crate.files[module], line)
            graphs.setdefault(folder, {}).setdefault(edge, where)
    return graphs


def components(nodes, edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def read_allow(path):
    allowed, problems = {}, []
    if not path or not os.path.exists(path):
        return allowed, problems
    for number, raw in enumerate(open(path, encoding="utf-8"), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        m = re.match(r"^(\S+):\s*(\w+)\s*->\s*(\w+)\s*#\s*(\S.*)$", text)
        if not m:
            problems.append(
                "%s:%d: expected `FOLDER: A -> B  # reason`, got: %s" % (path, number, text)
            )
            continue
        allowed[(m.group(1).rstrip("/"), (m.group(2), m.group(3)))] = "%s:%d" % (path, number)
    return allowed, problems


# --- Long functions ---------------------------------------------------------


def long_functions(crate, limit):
    rows = []
    for module, path in sorted(crate.files.items(), key=lambda kv: kv[1]):
        code = crate.code[module]
        raw = open(path, encoding="utf-8").read().split("\n")
        for m in re.finditer(r"\bfn\s+(\w+)", code):
            j, depth = m.end(), 0
            while j < len(code):
                ch = code[j]
                if ch in "([<" and not (ch == "<" and code[j - 1] == "-"):
                    depth += 1
                elif ch in ")]>" and not (ch == ">" and code[j - 1] in "-="):
                    depth -= 1
                elif ch == ";" and depth <= 0:
                    j = -1
                    break
                elif ch == "{" and depth <= 0:
                    break
                j += 1
            if j < 0 or j >= len(code):
                continue
            first = code.count("\n", 0, m.start())
            last = code.count("\n", 0, matching_brace(code, j))
            length = last - first + 1
            if length <= limit:
                continue
            head = first
            while head > 0 and re.match(r"\s*(///|//|#\[)", raw[head - 1]):
                head -= 1
            said = "\n".join(raw[head : first + 4])
            reason = "reason given" if re.search(r"\bsplit", said) else "no reason"
            if module[-1:] == ("tests",) or any(
                s <= m.start() <= e and name == "tests" for s, e, name in inline_mods(code)
            ):
                reason += ", test"
            rows.append((length, "%s:%d" % (path, first + 1), m.group(1), reason))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allow", help="file of allowed edges (see the script's doc)")
    parser.add_argument("--quiet", action="store_true", help="print the cycles only")
    parser.add_argument("--evidence", action="store_true", help="where each edge comes from")
    parser.add_argument("--long-functions", type=int, metavar="N", help="list functions over N lines")
    parser.add_argument("--max-lines", type=int, metavar="N",
                        help="fail on a function over N lines that gives no reason")
    parser.add_argument("--root", default=SRC)
    args = parser.parse_args()

    crate = Crate(args.root)
    if args.long_functions:
        rows = long_functions(crate, args.long_functions)
        for length, where, name, reason in sorted(rows, reverse=True):
            print("%4d  %-45s %s (%s)" % (length, where, name, reason))
        print("%d functions longer than %d lines" % (len(rows), args.long_functions))
        return 0

    graphs = folder_graphs(crate)
    allowed, problems = read_allow(args.allow)
    cycles_found = 0
    used = set()
    for folder in sorted(graphs):
        edges = graphs[folder]
        nodes = {n for e in edges for n in e}
        whole = components(nodes, edges)
        if not args.quiet or whole:
            print("%s/" % folder)
        by_source = {}
        for a, b in sorted(edges):
            by_source.setdefault(a, []).append(b)
        for a in sorted(by_source) if not args.quiet else []:
            print("  %s -> %s" % (a, ", ".join(by_source[a])))
            if args.evidence:
                for b in by_source[a]:
                    print("      %s -> %s  (%s)" % (a, b, edges[(a, b)]))
        kept = {e: w for e, w in edges.items() if (folder, e) not in allowed}
        for key in allowed:
            if key[0] != folder:
                continue
            a, b = key[1]
            if key[1] not in edges:
                problems.append("%s: %s -> %s is allowed but no longer there: remove the line (%s)"
                                % (folder, a, b, allowed[key]))
            elif not any(a in c and b in c for c in whole):
                problems.append("%s: %s -> %s is allowed but closes no cycle: remove the line (%s)"
                                % (folder, a, b, allowed[key]))
            used.add(key)
        for comp in whole:
            inside = [e for e in sorted(edges) if e[0] in comp and e[1] in comp]
            status = "allowed" if not any(
                c for c in components(nodes, kept) if set(c) & set(comp)) else "CYCLE"
            if status == "CYCLE":
                cycles_found += 1
            print("  %s: %s" % (status, " <-> ".join(comp)))
            for a, b in inside:
                mark = "allowed" if (folder, (a, b)) in allowed else ""
                print("      %s -> %s  (%s) %s" % (a, b, edges[(a, b)], mark))
    for key, where in allowed.items():
        if key not in used:
            problems.append("%s: %s -> %s is allowed but that folder has no such edge (%s)"
                            % (key[0], key[1][0], key[1][1], where))
    if args.max_lines:
        for length, where, name, reason in sorted(long_functions(crate, args.max_lines), reverse=True):
            if reason.startswith("no reason"):
                problems.append("%s: %s is %d lines, more than %d, and its head does not say why it "
                                "is not split" % (where, name, length, args.max_lines))
    for p in problems:
        print("check-modules: %s" % p, file=sys.stderr)
    if cycles_found:
        print("check-modules: %d import cycle(s) between the entries of a folder (above, marked CYCLE)"
              % cycles_found, file=sys.stderr)
    if cycles_found or problems:
        return 1
    print("check-modules: no import cycle%s%s" % (
        " beyond the allowed edges" if allowed else "",
        ", no function over %d lines without its reason" % args.max_lines if args.max_lines else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
