#!/usr/bin/env bash
# Checks the formatting (.clang-format, clang-format 14) of the C, C++ and CUDA
# lines a change touches: every line added or changed since BASE (default
# HEAD~1), committed or not, and every line of new untracked files.  Lines a
# change does not touch are not judged, so older files need no mass reformat.
#   usage: scripts/check_format.sh [BASE]       (CI: .ci/run, before the build)
#          scripts/check_format.sh --fix [BASE] (rewrites the touched lines)
# Where BASE is not in the clone (a shallow or single-commit clone has no
# HEAD~1), there is nothing to compare with: it says so and checks nothing.
# Exit status: 0 when formatted, 1 with the diff that would fix it, 2 when
# clang-format 14 is missing.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
fix=0
if [ "${1:-}" = "--fix" ]; then fix=1; shift; fi
base=${1:-HEAD~1}
format=${CLANG_FORMAT:-clang-format-14}
format_diff=${CLANG_FORMAT_DIFF:-clang-format-diff-14}
for tool in "$format" "$format_diff"; do
  if ! command -v "$tool" > /dev/null; then
    echo "check_format: $tool not found (Debian: apt-get install clang-format-14)" >&2
    exit 2
  fi
done
if ! git rev-parse --verify -q "$base^{commit}" > /dev/null; then
  echo "check_format: '$base' is not in this clone (shallow or single-commit): nothing to compare with, nothing checked"
  exit 0
fi

sources='.*\.(c|h|cc|cpp|hpp|cu|cuh)'
patch=$(git diff -U0 --no-color --diff-filter=ACMR "$base" -- .)
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

if [ -n "${report//[$'\n ']/}" ] && [ $fix = 0 ]; then
  printf '%s\n' "$report"
  echo "check_format: the lines above are not formatted as .clang-format says;" \
       "run scripts/check_format.sh --fix $base" >&2
  exit 1
fi
echo "check_format: $checked changed C/C++/CUDA file(s) since $base $([ $fix = 1 ] && echo rewritten || echo formatted)"
