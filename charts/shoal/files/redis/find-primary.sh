# Sourced by redis-start.sh and sentinel-start.sh (POSIX sh). find_primary [SKIP] sets
# primary_host and primary_port to the primary the sentinels name, asking each in turn (all but
# SKIP, host:port: a sentinel does not ask itself), or to the first node while none answers.
#   SENTINELS   the sentinels, host:port separated by spaces
#   SERVICE     the name they monitor the primary under
#   FIRST_NODE  host:port of the first node, the primary of a group no sentinel knows yet
# shellcheck disable=SC2034  # primary_host and primary_port are the caller's
find_primary() {
  primary_host=''
  primary_port=''
  for sentinel in $SENTINELS; do
    [ "$sentinel" = "${1:-}" ] && continue
    answer=$(redis-cli -h "${sentinel%:*}" -p "${sentinel##*:}" --no-auth-warning \
      SENTINEL get-master-addr-by-name "$SERVICE" 2>/dev/null) || continue
    host=$(printf '%s\n' "$answer" | sed -n 1p)
    port=$(printf '%s\n' "$answer" | sed -n 2p)
    case "$port" in
      ''|*[!0-9]*) continue ;;  # nil, or an error such as NOAUTH
    esac
    primary_host=$host
    primary_port=$port
    return 0
  done
  primary_host=${FIRST_NODE%:*}
  primary_port=${FIRST_NODE##*:}
}
