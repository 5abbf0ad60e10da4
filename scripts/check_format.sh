#!/usr/bin/env bash
# Checks the formatting (.clang-format, clang-format 14) of the C, C++ and CUDA
# lines a change touches: every line added or changed since BASE, committed or
# not, and every line of new untracked files.  Lines a change does not touch
# are not judged, so older files need no mass reformat.
#   usage: scripts/check_format.sh [BASE]       (CI: .ci/run, before the build)
#          scripts/check_format.sh --fix [BASE] (rewrites the touched lines)
# BASE defaults to HEAD~1.  When HEAD is a merge and no BASE is given, only the
# lines that differ from every parent are checked (the merge's own edits: each
# side was checked on its own commits).  Where BASE is not in the clone (a
# shallow or single-commit clone has no HEAD~1), there is nothing to compare
# with: it says so and checks nothing.
# Exit status: 0 when formatted, 1 with the diff that would fix it, 2 when
# clang-format 14 is missing.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
fix=0
if [ "${1:-}" = "--fix" ]; then fix=1; shift; fi
bases=("${1:-HEAD~1}")
if [ $# -eq 0 ] && git rev-parse --verify -q HEAD^2 > /dev/null; then
  mapfile -t bases < <(git rev-parse "HEAD^@") # a merge: every parent
fi
format=${CLANG_FORMAT:-clang-format-14}
format_diff=${CLANG_FORMAT_DIFF:-clang-format-diff-14}
for tool in "$format" "$format_diff"; do
  if ! command -v "$tool" > /dev/null; then
    echo "check_format: $tool not found (Debian: apt-get install clang-format-14)" >&2
    exit 2
  fi
done
for base in "${bases[@]}"; do
  if ! git rev-parse --verify -q "$base^{commit}" > /dev/null; then
    echo "check_format: '$base' is not in this clone (shallow or single-commit): nothing to compare with, nothing checked"
    exit 0
  fi
done

sources='.*\.(c|h|cc|cpp|hpp|cu|cuh)'
# The lines changed relative to every base, as a unified diff of one-line hunks
# (all clang-format-diff reads: the file names and the new line numbers).
patch=$(for base in "${bases[@]}"; do
          git diff -U0 --no-color --diff-filter=ACMR "$base" -- . | sed "s/^/$base /"
        done | python3 -c '
import re, sys
bases, lines = [], {}
for row in sys.stdin:
    base, _, text = row.rstrip("\n").partition(" ")
    if base not in bases:
        bases.append(base)
    if text.startswith("+++ b/"):
        name = text[6:]
    m = re.match(r"@@ .* \+(\d+)(?:,(\d+))? @@", text)
    if m:
        first, count = int(m.group(1)), int(m.group(2) or 1)
        lines.setdefault(name, {}).setdefault(base, set()).update(range(first, first + count))
for name, per_base in sorted(lines.items()):
    common = set.intersection(*[per_base.get(b, set()) for b in bases])
    if common:
        print("+++ b/" + name)
        for n in sorted(common):
            print("@@ -0,0 +%d,1 @@" % n)
')
mode=()
[ $fix = 1 ] && mode=(-i)
report=$(printf '%s\n' "$patch" | "$format_diff" -p1 -binary "$format" -regex "$sources" "${mode[@]}")
checked=$(printf '%s\n' "$patch" | grep -Ec '^\+\+\+ b/.*\.(c|h|cc|cpp|hpp|cu|cuh)$' || true)

# New files git does not track yet (and does not ignore): all their lines are new.
while IFS= read -r file; do
  [[ "$file" =~ ^${sources}$ ]] || continue
  checked=$((checked + 1))
  if [ $fix = 1 ]; then
    "$format" -i "$file"
  elif ! "$format" --dry-run -Werror "$file" > /dev/null 2>&1; then
    report+=$'\n'"$(diff -u "$file" <("$format" "$file") --label "$file" --label "$file (formatted)" || true)"
  fi
done < <(git ls-files --others --exclude-standard)

what="since ${bases[*]}"
[ ${#bases[@]} -gt 1 ] && what="by the merge (lines new to every parent)"
if [ -n "${report//[$'\n ']/}" ] && [ $fix = 0 ]; then
  printf '%s\n' "$report"
  echo "check_format: the lines above are not formatted as .clang-format says;" \
       "run scripts/check_format.sh --fix ${1:-}" >&2
  exit 1
fi
echo "check_format: $checked C/C++/CUDA file(s) changed $what $([ $fix = 1 ] && echo rewritten || echo formatted)"
