#!/usr/bin/env bash
# Make this run's uncommitted work searchable for the run: every changed path, not only `git diff`.
#
#   export MOONMIND_RUN_ID=run-42 MOONMIND_REPO=myrepo    # a job exports these (`moonmind job start`, JobTask)
#   bash docs/examples/overlay.sh [--ttl 2h] [--json]     # any `rag overlay upsert` flag is passed through
#
# Run it anywhere inside the git work tree you indexed. What goes to `moonmind rag overlay upsert`:
#   - modified files, staged or not                      git ls-files --modified, git diff --cached
#   - new files git does not track yet (not ignored)     git ls-files --others --exclude-standard
#   - deleted files, `rm` or `git rm`, and the old name   git diff --diff-filter=D HEAD, git diff --cached
#     of a staged rename: each becomes a tombstone that hides its canonical chunks for the run
# `git diff --name-only` alone misses the new files and the staged deletions.
# Paths travel NUL-separated, so names with spaces or newlines survive.
set -euo pipefail

top=$(git rev-parse --show-toplevel)
cd "$top"  # git prints paths relative to the top of the work tree; so does --root below
if git rev-parse --verify --quiet HEAD >/dev/null; then
    base=HEAD
else
    base=$(git hash-object -t tree /dev/null)  # no commit yet: everything is new
fi

mapfile -d '' -t paths < <(
    {
        git ls-files -z --modified --others --exclude-standard   # edited (deleted ones too) and new
        git diff -z --name-only --no-renames --diff-filter=D "$base"   # deleted, staged or not
        git diff -z --name-only --no-renames --cached "$base"    # staged: added, changed, deleted, renamed
    } | sort -zu
)

if ((${#paths[@]} == 0)); then
    echo "overlay: no uncommitted changes under $top; nothing to upsert" >&2
    exit 0
fi
exec "${MOONMIND:-moonmind}" rag overlay upsert --root "$top" "$@" -- "${paths[@]}"
