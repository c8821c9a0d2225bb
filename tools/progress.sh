# Progress of the long steps of a cold machine, sourced by metis_dev/build.sh and
# tools/gobuild.sh: a wait on a build lock says who holds it and for how long, and a long
# command says every 30 s what it is still doing and for how long, on stderr (a cold build
# sat silent for minutes on one line before).
#
#   take_lock FD FILE WHAT     take the flock on FD (open on FILE), saying whose it is meanwhile
#   with_heartbeat WHAT CMD... run CMD, saying "still WHAT (N s)" every 30 s until it ends
PROGRESS_SECONDS="${METIS_PROGRESS_SECONDS:-30}"

take_lock() { # <fd> <lock file> <what the holder builds>
  local fd="$1" file="$2" what="$3" t0=$SECONDS
  if ! flock -n "$fd"; then
    echo "$(basename "$0"): waiting for the lock on $what: $(cat "$file.holder" 2>/dev/null || echo 'another build') holds $file" >&2
    until flock -w "$PROGRESS_SECONDS" "$fd"; do
      echo "$(basename "$0"): still waiting for the lock on $what ($((SECONDS - t0)) s so far)" >&2
    done
    echo "$(basename "$0"): got the lock on $what after $((SECONDS - t0)) s" >&2
  fi
  echo "pid $$ ($(basename "$0") building $what since $(date -u +%H:%M:%SZ))" > "$file.holder"
}

with_heartbeat() { # <what> <command...>
  local what="$1" t0=$SECONDS beat status
  shift
  (
    while sleep "$PROGRESS_SECONDS"; do
      echo "$(basename "$0"): still $what ($((SECONDS - t0)) s so far)" >&2
    done
  ) &
  beat=$!
  status=0
  "$@" || status=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$status"
}
