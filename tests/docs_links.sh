#!/usr/bin/env bash
# Checks every relative link in the repository's Markdown files: the file or folder it names
# exists, and a #fragment names a heading of the target (GitHub's anchors: lower case,
# punctuation dropped, spaces as dashes). Links inside code (fenced or indented blocks,
# `spans`) are not links. Absolute links (http:, https:, mailto:) are left alone.
#
#   tests/docs_links.sh [FILE.md...]      (default: every *.md outside third_party/ and runs/)
#
# Prints each broken link as FILE: TARGET (why). Exits 1 when one is broken.
# Last line: "docs_links stage: P passed, F failed, 0 skipped".
set -uo pipefail
cd "$(dirname "$0")/.."

if (($# > 0)); then
  files=("$@")
else
  # find, not git: a fresh machine's tests/run.sh may run where git is not installed.
  mapfile -t files < <(find . \( -name .git -o -name third_party -o -name runs \) -prune -o \
    -name '*.md' -type f -print | sed 's|^\./||' | sort)
  ((${#files[@]})) || { echo "docs_links: no Markdown file found"; echo "docs_links stage: 0 passed, 1 failed, 0 skipped"; exit 1; }
fi

# The links of a Markdown file, one a line, outside code.
links_of() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^(    |\t)/ { next }                       # an indented code block
    {
      line = $0
      gsub(/`[^`]*`/, "", line)                # code spans
      while (match(line, /\]\([^)[:space:]]+(\)|[[:space:]])/)) {
        target = substr(line, RSTART + 2, RLENGTH - 3)
        print target
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

# The anchors of a Markdown file's headings, one a line.
anchors_of() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+[ \t]/ { sub(/^#+[ \t]+/, ""); print }' "$1" |
    tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}

passed=0 failed=0
for file in "${files[@]}"; do
  [[ -f $file ]] || { echo "$file: no such file"; failed=$((failed + 1)); continue; }
  dir=$(dirname "$file")
  while IFS= read -r target; do
    case $target in
      http:* | https:* | mailto:*) continue ;;
    esac
    path=${target%%#*}
    fragment=""
    [[ $target == *"#"* ]] && fragment=${target#*#}
    if [[ -z $path ]]; then
      resolved=$file
    else
      resolved=$dir/$path
    fi
    if [[ ! -e $resolved ]]; then
      echo "$file: $target (no $resolved)"
      failed=$((failed + 1))
      continue
    fi
    if [[ -n $fragment ]]; then
      if [[ ! -f $resolved ]] || ! anchors_of "$resolved" | grep -qxF -- "$fragment"; then
        echo "$file: $target (no heading #$fragment in $resolved)"
        failed=$((failed + 1))
        continue
      fi
    fi
    passed=$((passed + 1))
  done < <(links_of "$file")
done
echo "docs_links stage: $passed passed, $failed failed, 0 skipped"
((failed == 0))
