#!/usr/bin/env python3
"""Unity builds compile several source files of a target as one translation unit, so two files'
file-local names (an anonymous namespace's or a static's) meet: the same name twice is a compile error
at best, and at worst an overload of one file chosen silently in another. This check fails when two
sources of one target define the same name in the same namespace and one of them is file-local.

usage: unity_names.py TARGET SOURCE_DIR SOURCES [TARGET SOURCE_DIR SOURCES]...
(SOURCES: the target's SOURCES property, separated by '|' or ';', relative to SOURCE_DIR or absolute.)
"""
import os
import re
import sys

OPEN = re.compile(r"^namespace(\s+[\w:]+)?\s*\{")
CLOSE = re.compile(r"^\}\s*//\s*namespace")
KEYWORDS = {"return", "if", "for", "while", "switch", "else", "do", "TEST", "TEST_F", "TEST_P", "using", "typedef",
            "template", "namespace", "public", "private", "protected", "case", "default", "operator"}
# A definition at column 0: a type or function (name before '(' or '{'), or a variable (name before '=', '{', '[').
TYPE = re.compile(r"^(?:struct|class|enum(?: class)?|union)\s+(\w+)")
FUNC = re.compile(r"^(?:static\s+|inline\s+|constexpr\s+|\[\[[\w:]+\]\]\s+)*[\w:<>,\*&\s]+?[\s\*&](\w+)\s*\(")
VAR = re.compile(r"^(?:static\s+|inline\s+|constexpr\s+|const\s+|thread_local\s+)*[\w:<>,\*&\s]+?[\s\*&](\w+)\s*(?:=|\{|\[|;)")


def local_names(path, public=None):
    """{(namespace, name)}: each file-local name with the named namespace around it ('accel::zero').
    `public`, a set, receives the file's other definitions at namespace scope the same way."""
    names = set()
    stack = []  # (anonymous?, name) of each open namespace
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = OPEN.match(line)
            if m:
                stack.append((m.group(1) is None, (m.group(1) or "").strip()))
                continue
            if CLOSE.match(line):
                if stack:
                    stack.pop()
                continue
            if not line[:1].isalpha() or line.startswith(("#", "//")):
                continue
            local = any(anon for anon, _ in stack) or line.startswith("static ")
            if not local and public is None:
                continue
            word = line.split()[0] if line.split() else ""
            # (an alias or a using-directive: the same one twice is legal, a different one a compile error)
            if word in KEYWORDS:
                continue
            for rx in (TYPE, FUNC, VAR):
                m = rx.match(line)
                if m and m.group(1) not in KEYWORDS:
                    key = ("::".join(n for anon, n in stack if not anon), m.group(1))
                    (names if local else public).add(key)
                    break
    return names


def main(argv):
    if len(argv) % 3 != 0 or not argv:
        sys.exit(__doc__)
    bad = 0
    for i in range(0, len(argv), 3):
        target, src_dir, sources = argv[i], argv[i + 1], argv[i + 2].replace("|", ";").split(";")
        seen = {}  # name -> [(namespace, file)]
        public = {}  # (namespace, name) -> file: what a file defines for the others (declared in a header)
        for s in sources:
            if not s.endswith((".cpp", ".cc", ".cxx")):
                continue
            path = s if os.path.isabs(s) else os.path.join(src_dir, s)
            rel = os.path.relpath(path, src_dir)
            mine = set()
            for ns, n in local_names(path, mine):
                seen.setdefault(n, []).append((ns, rel))
            for key in mine:
                public.setdefault(key, rel)
        # Two files' names meet in the same namespace (a file that defines a name finds its own before
        # an enclosing namespace's).
        def meet(a, b):
            return a == b
        clashes = {}
        for n, defs in seen.items():
            fs = sorted({f for i, (ns, f) in enumerate(defs) for ns2, f2 in defs[i + 1:] if f != f2 and meet(ns, ns2)
                         for f in (f, f2)})
            # A file-local name beside another file's public one in the same namespace: once the other
            # file's header is in the batch, a call may pick either.
            fs += sorted({f for ns, f in defs if public.get((ns, n), f) != f} |
                         {public[(ns, n)] for ns, f in defs if public.get((ns, n), f) != f})
            if fs:
                clashes[n] = sorted(set(fs))
        for n, fs in sorted(clashes.items()):
            print(f"{target}: '{n}' is defined in {len(fs)} sources, file-local in at least one: {', '.join(fs)}")
        bad += len(clashes)
        print(f"{target}: {len(sources)} sources, {len(seen)} file-local names, {len(clashes)} shared")
    if bad:
        print("FAIL: rename the file-local names above (unity builds put their files in one translation unit)")
        return 1
    print("no file-local name is defined in two sources of one target")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
