"""The user's documents hold together: every relative link in README.md, CONTRIBUTING.md, docs/*.md,
tests/README.md and benchmarks/README.md names a file or folder that exists, README.md stays a guide
of at most 300 lines, and it carries no dates, commit hashes or issue numbers (history goes to
benchmarks/results/), nor does anything under src/ carry dates or issue numbers, or throw a standard
exception type instead of one of accel::Error's (src/base/error.h). Usage: python3 tests/docs_links.py SOURCE_DIR"""
import glob, os, re, sys

root = sys.argv[1]
docs = ["README.md", "CONTRIBUTING.md", "tests/README.md", "benchmarks/README.md"] + [
    os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md"))]
bad = []
for doc in docs:
    path = os.path.join(root, doc)
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://|^#|^mailto:", target):
            continue
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target.split("#")[0]))
        if not os.path.exists(resolved):
            bad.append(f"{doc}: link to {target} ({resolved}) does not exist")
readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
lines = readme.count("\n")
if lines > 300:
    bad.append(f"README.md has {lines} lines (at most 300)")
for what, pattern in [("a date", r"\b20\d\d-\d\d-\d\d\b"), ("an issue number", r"\b[Ii]ssue \d+"),
                      ("a commit hash", r"`[0-9a-f]{7,40}`")]:
    for m in re.finditer(pattern, readme):
        bad.append(f"README.md holds {what}: {m.group(0)}")
# Under src/: no dates or issue numbers in code, comments or messages either.
for path in glob.glob(os.path.join(root, "src", "**", "*"), recursive=True):
    if not os.path.isfile(path) or not path.endswith((".h", ".cpp", ".txt", ".in")):
        continue
    for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
        for what, pattern in [("a date", r"\b20\d\d-\d\d-\d\d\b"), ("an issue number", r"\b[Ii]ssue \d+"),
                              ("a standard exception thrown (throw an accel::Error type, base/error.h)",
                               r"throw std::(invalid_argument|runtime_error|logic_error|out_of_range|domain_error)\(")]:
            if re.search(pattern, line):
                bad.append(f"{os.path.relpath(path, root)}:{n} holds {what}: {line.strip()[:80]}")
print("\n".join(bad) if bad else f"{len(docs)} documents: every link resolves; README.md {lines} lines; src/ clean")
sys.exit(1 if bad else 0)
