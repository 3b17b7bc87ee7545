# Sourced by the bench/serve scripts. serve_up PID PORT LOG: waits up to
# 300 s for the server PID to answer 200 on localhost:PORT/health; returns 0
# once it does, else prints the end of LOG, stops the server and returns 1.
serve_up() {
  local pid=$1 port=$2 log=$3
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "the server did not come up ($log):"
  tail -5 "$log"
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"
  return 1
}
