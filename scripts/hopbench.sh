#!/usr/bin/env bash
# hopbench.sh: what one hop in front of a serving node costs, side by side
# in one run, on this machine.
#
# Node B (a real infermesh process holding the tiny-bert embeddings model)
# answers POST /v1/embeddings. The same request reaches it five ways:
#
#   direct   the client calls B
#   mesh     the client calls node A (no models), which forwards to B over
#            the node-to-node Connect protocol: the mesh hop
#   rawgo    the floor of a Go hop: a loop over raw TCP that scans each
#            message's head for Content-Length and copies it to a pooled
#            connection to B (no net/http, no routing; not a proxy anyone
#            should run: it shows what the language and runtime cost)
#   nethttp  net/http's server in front of B, writing each request to a
#            pooled connection and reading the answer with
#            http.ReadResponse on the handler's goroutine (no transport
#            goroutines): what net/http's server adds to rawgo
#   goproxy  Go's net/http/httputil.ReverseProxy in front of B (a small
#            program this script builds; the project's yardstick)
#   nginx    nginx in front of B (upstream keep-alive), when installed
#   haproxy  HAProxy in front of B (http-reuse always), when installed
#
# For each path it measures, with wrk (POST, keep-alive):
#   - latency at concurrency 1: p50 and p99, and what the hop adds over
#     direct (the direct figures of the same round);
#   - throughput at concurrency 64 (requests per second, and the ratio to
#     direct);
#   - hop CPU per request at concurrency 64: utime+stime from
#     /proc/<pid>/stat of the proxy process (nginx: master and workers),
#     summed over the run, divided by the requests wrk completed; and B's
#     CPU per request the same way (the serving side's share of the hop).
# Paths are measured in rounds with a rotated order, so load from other
# processes hits all alike; the table shows the median over the rounds,
# and below it the mesh hop's ratios to each other proxy, taken within
# each round (median and range): the issue-13 targets are hop CPU <= 2x
# nginx's, throughput >= 0.9x nginx's and added p50 <= HAProxy's.
#
# Usage: scripts/hopbench.sh            (from the repository root)
# Environment:
#   HOPBENCH_DURATION  seconds per measurement (default 5)
#   HOPBENCH_ROUNDS    rounds (default 3)
#   HOPBENCH_PORT      first of the loopback ports used (default 28100)
#   HOPBENCH_FLOORS    0: leave out the rawgo and nethttp paths
#   HOPBENCH_STREAM    0: the entry node gives every request a Connect
#                      call of its own (--forward-stream=false); default:
#                      the multiplexed stream, as a node does by default
#   HOPBENCH_A_ENV    environment assignments for the entry node A only,
#                      e.g. "GOGC=400" (its live heap is a few MB, so at
#                      Go's default its GC runs every few hundred requests)
#                      or "GOMAXPROCS=1"
#   HOPBENCH_INSTALL=1 install wrk, nginx and haproxy with apt-get when
#                      missing (needs root)
#   HOPBENCH_MODEL     model folder to import into B (default
#                      ~/.cache/infermesh/models/tiny-bert; `make assets`)
#   HOPBENCH_KEEP=1    keep the work directory (logs, configs)
# wrk is required; nginx and HAProxy are measured when installed.
set -euo pipefail

DUR=${HOPBENCH_DURATION:-5}
ROUNDS=${HOPBENCH_ROUNDS:-3}
PORT=${HOPBENCH_PORT:-28100}
CACHE=${CACHE:-$HOME/.cache/infermesh}
MODEL_DIR=${HOPBENCH_MODEL:-$CACHE/models/tiny-bert}
MODEL=tiny-bert:test-128
SECRET=hopbench-cluster-secret

if [ "${HOPBENCH_INSTALL:-}" = 1 ]; then
  missing=()
  for p in wrk nginx haproxy; do command -v "$p" >/dev/null || [ -x /usr/sbin/$p ] || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y "${missing[@]}" >/dev/null
  fi
fi
command -v wrk >/dev/null || { echo "hopbench: wrk is required (apt-get install -y wrk, or HOPBENCH_INSTALL=1)" >&2; exit 1; }
NGINX=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)
HAPROXY=$(command -v haproxy || { [ -x /usr/sbin/haproxy ] && echo /usr/sbin/haproxy; } || true)
[ -f "$MODEL_DIR/manifest.json" ] || { echo "hopbench: no model at $MODEL_DIR (run make assets)" >&2; exit 1; }

W=$(mktemp -d /tmp/hopbench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${HOPBENCH_KEEP:-}" = 1 ]; then echo "hopbench: kept $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT

B_HTTP=$PORT; B_GOSSIP=$((PORT + 1)); B_RPC=$((PORT + 2))
A_HTTP=$((PORT + 10)); A_GOSSIP=$((PORT + 11)); A_RPC=$((PORT + 12))
RP_PORT=$((PORT + 20)); NGINX_PORT=$((PORT + 21)); HAPROXY_PORT=$((PORT + 22))
RAW_PORT=$((PORT + 23)); NETHTTP_PORT=$((PORT + 24))

echo "hopbench: building" >&2
go build -o "$W/infermesh" ./cmd/infermesh
mkdir -p "$W/goproxy"
cat >"$W/goproxy/main.go" <<'EOF'
// A ReverseProxy server tuned as a Go operator would: keep-alive pool,
// pooled copy buffers, no compression.
package main

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"time"
)

type pool struct{ p sync.Pool }

func (p *pool) Get() []byte  { return *(p.p.Get().(*[]byte)) }
func (p *pool) Put(b []byte) { p.p.Put(&b) }

func main() {
	target, _ := url.Parse(os.Args[2])
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second,
			DisableCompression: true,
		},
		BufferPool: &pool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}},
	}
	panic(http.ListenAndServe(os.Args[1], rp))
}
EOF
(cd "$W/goproxy" && GO111MODULE=off go build -o goproxy main.go)
mkdir -p "$W/floors"
cat >"$W/floors/main.go" <<'EOF'
// The floors of a Go hop in front of B, both over pooled keep-alive
// connections to it: "raw" (no net/http at all) and "nethttp" (net/http's
// server, the upstream exchange written and read on the handler's
// goroutine). Only what the benchmark sends is handled: requests and
// answers with Content-Length; anything else ends the connection.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
)

// upstream is one pooled connection to B.
type upstream struct {
	c net.Conn
	r *bufio.Reader
}

var (
	target = os.Args[3]
	pool   = make(chan *upstream, 1024)
)

func get() (*upstream, error) {
	select {
	case u := <-pool:
		return u, nil
	default:
	}
	c, err := net.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	return &upstream{c: c, r: bufio.NewReaderSize(c, 16<<10)}, nil
}

func put(u *upstream) {
	select {
	case pool <- u:
	default:
		u.c.Close()
	}
}

var errFraming = errors.New("floors: only Content-Length messages")

// readMessage appends one HTTP/1.1 message (head and Content-Length body)
// from r to buf[:0].
func readMessage(r *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	n := 0
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		buf = append(buf, line...)
		if len(line) <= 2 {
			break
		}
		if i := bytes.IndexByte(line, ':'); i > 0 {
			switch k := line[:i]; {
			case bytes.EqualFold(k, []byte("Content-Length")):
				if n, err = strconv.Atoi(string(bytes.TrimSpace(line[i+1:]))); err != nil || n < 0 || n > 1<<20 {
					return nil, errFraming
				}
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				return nil, errFraming
			}
		}
	}
	head := len(buf)
	buf = slices.Grow(buf, n)[:head+n]
	_, err := io.ReadFull(r, buf[head:])
	return buf, err
}

// raw serves one client connection: each request goes to B as it came.
func raw(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 16<<10)
	var req, resp []byte
	for {
		var err error
		if req, err = readMessage(r, req); err != nil {
			return
		}
		u, err := get()
		if err != nil {
			return
		}
		if _, err = u.c.Write(req); err == nil {
			resp, err = readMessage(u.r, resp)
		}
		if err != nil {
			u.c.Close()
			return
		}
		put(u)
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// hop is the nethttp handler: the request's head is written afresh
// (method, target, Host, Content-Type, Content-Length) with its body in
// one write to B.
func hop(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength < 0 || r.ContentLength > 1<<20 {
		http.Error(w, errFraming.Error(), http.StatusBadRequest)
		return
	}
	head := r.Method + " " + r.RequestURI + " HTTP/1.1\r\nHost: " + r.Host + "\r\nContent-Type: " + r.Header.Get("Content-Type") +
		"\r\nContent-Length: " + strconv.FormatInt(r.ContentLength, 10) + "\r\n\r\n"
	req := make([]byte, len(head)+int(r.ContentLength))
	copy(req, head)
	if _, err := io.ReadFull(r.Body, req[len(head):]); err != nil {
		return
	}
	u, err := get()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	var resp *http.Response
	if _, err = u.c.Write(req); err == nil {
		resp, err = http.ReadResponse(u.r, r)
	}
	if err != nil {
		u.c.Close()
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, err = io.Copy(w, resp.Body)
	resp.Body.Close()
	if err != nil || resp.Close {
		u.c.Close()
		return
	}
	put(u)
}

func main() {
	ln, err := net.Listen("tcp", os.Args[2])
	if err != nil {
		panic(err)
	}
	if os.Args[1] == "nethttp" {
		panic(http.Serve(ln, http.HandlerFunc(hop)))
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		go raw(c)
	}
}
EOF
(cd "$W/floors" && GO111MODULE=off go build -o floors main.go)

echo "hopbench: starting nodes" >&2
mkdir -p "$W/a" "$W/b"
"$W/infermesh" models import --data-dir "$W/b" "$MODEL_DIR" >/dev/null
"$W/infermesh" serve --data-dir "$W/b" --node-id hop-b --listen 127.0.0.1:$B_HTTP \
  --gossip-listen 127.0.0.1:$B_GOSSIP --rpc-listen 127.0.0.1:$B_RPC --cluster-secret $SECRET \
  --audit=false --dashboard=false 2>"$W/b.log" &
B_PID=$!; PIDS+=("$B_PID")
env ${HOPBENCH_A_ENV:-} "$W/infermesh" serve --data-dir "$W/a" --node-id hop-a --listen 127.0.0.1:$A_HTTP \
  --gossip-listen 127.0.0.1:$A_GOSSIP --rpc-listen 127.0.0.1:$A_RPC --cluster-secret $SECRET \
  --join 127.0.0.1:$B_GOSSIP --audit=false --dashboard=false --forward-stream=$([ "${HOPBENCH_STREAM:-1}" = 0 ] && echo false || echo true) 2>"$W/a.log" &
A_PID=$!; PIDS+=("$A_PID")
"$W/goproxy/goproxy" 127.0.0.1:$RP_PORT http://127.0.0.1:$B_HTTP 2>"$W/goproxy.log" &
RP_PID=$!; PIDS+=("$RP_PID")
if [ "${HOPBENCH_FLOORS:-1}" != 0 ]; then
  # GOGC=400: their live heaps are tiny, and at Go's default the GC would
  # run every few hundred requests; the mesh node sets a heap floor of its
  # own (cmd/infermesh/gcfloor.go), so the GC's pace does not decide the
  # comparison.
  GOGC=400 "$W/floors/floors" raw 127.0.0.1:$RAW_PORT 127.0.0.1:$B_HTTP 2>"$W/rawgo.log" &
  RAW_PID=$!; PIDS+=("$RAW_PID")
  GOGC=400 "$W/floors/floors" nethttp 127.0.0.1:$NETHTTP_PORT 127.0.0.1:$B_HTTP 2>"$W/nethttp.log" &
  NETHTTP_PID=$!; PIDS+=("$NETHTTP_PID")
fi

BODY='{"model":"'$MODEL'","input":"the quick brown fox jumps over the lazy dog"}'
cat >"$W/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
EOF

# wait_ok URL: until an embeddings request answers 200 (and, through A,
# comes from B).
wait_ok() {
  for _ in $(seq 1 300); do
    if out=$(curl -s -o /dev/null -D - -X POST -H 'Content-Type: application/json' -d "$BODY" "$1/v1/embeddings" 2>/dev/null) &&
      grep -q '^HTTP/1.1 200' <<<"$out"; then
      return 0
    fi
    sleep 0.2
  done
  echo "hopbench: $1 never answered 200; logs in $W" >&2
  HOPBENCH_KEEP=1
  exit 1
}

PATHS=(direct mesh goproxy)
declare -A URL=([direct]=http://127.0.0.1:$B_HTTP [mesh]=http://127.0.0.1:$A_HTTP [goproxy]=http://127.0.0.1:$RP_PORT)
declare -A PROC=([direct]="" [mesh]=$A_PID [goproxy]=$RP_PID)
if [ "${HOPBENCH_FLOORS:-1}" != 0 ]; then
  PATHS+=(rawgo nethttp)
  URL[rawgo]=http://127.0.0.1:$RAW_PORT; PROC[rawgo]=$RAW_PID
  URL[nethttp]=http://127.0.0.1:$NETHTTP_PORT; PROC[nethttp]=$NETHTTP_PID
fi

if [ -n "$NGINX" ]; then
  mkdir -p "$W/nginx"
  cat >"$W/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $W/nginx;
  proxy_temp_path $W/nginx;
  fastcgi_temp_path $W/nginx;
  uwsgi_temp_path $W/nginx;
  scgi_temp_path $W/nginx;
  upstream b { server 127.0.0.1:$B_HTTP; keepalive 128; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://b;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering on;
    }
  }
}
EOF
  "$NGINX" -c "$W/nginx/nginx.conf" -g 'daemon off;' 2>"$W/nginx/stderr" &
  NGINX_PID=$!; PIDS+=("$NGINX_PID")
  PATHS+=(nginx); URL[nginx]=http://127.0.0.1:$NGINX_PORT; PROC[nginx]=$NGINX_PID
fi
if [ -n "$HAPROXY" ]; then
  cat >"$W/haproxy.cfg" <<EOF
global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend f
  bind 127.0.0.1:$HAPROXY_PORT
  default_backend b
backend b
  server b1 127.0.0.1:$B_HTTP
EOF
  "$HAPROXY" -db -f "$W/haproxy.cfg" 2>"$W/haproxy.log" &
  HAPROXY_PID=$!; PIDS+=("$HAPROXY_PID")
  PATHS+=(haproxy); URL[haproxy]=http://127.0.0.1:$HAPROXY_PORT; PROC[haproxy]=$HAPROXY_PID
fi

for p in "${PATHS[@]}"; do wait_ok "${URL[$p]}"; done
backend=$(curl -s -o /dev/null -D - -X POST -H 'Content-Type: application/json' -d "$BODY" "${URL[mesh]}/v1/embeddings" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-service-backend"{print $2}')
[ "$backend" = hop-b ] || { echo "hopbench: A answered itself ($backend), not through B" >&2; exit 1; }

# ticks PID...: utime+stime of the processes and their children processes
# (nginx workers), in clock ticks.
ticks() {
  local t=0 p
  for p in "$@" $(for q in "$@"; do pgrep -P "$q" || true; done); do
    [ -r /proc/$p/stat ] || continue
    # Fields after the command (which may hold spaces): 14 utime, 15 stime.
    t=$((t + $(sed 's/^.*) //' /proc/$p/stat | awk '{print $12 + $13}')))
  done
  echo $t
}
HZ=$(getconf CLK_TCK)

# us VALUE: wrk's latency (123.45us, 1.20ms, 2.00s) in microseconds.
us() {
  awk -v v="$1" 'BEGIN{
    if (v ~ /us$/) { sub(/us$/, "", v); print v + 0 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); print v * 1000 }
    else if (v ~ /m$/) { sub(/m$/, "", v); print v * 60e6 }
    else { sub(/s$/, "", v); print v * 1e6 } }'
}

R="$W/results"; : >"$R"
warm() { wrk -t1 -c8 -d2s -s "$W/post.lua" "$1/v1/embeddings" >/dev/null; }
for p in "${PATHS[@]}"; do warm "${URL[$p]}"; done

n=${#PATHS[@]}
for round in $(seq 1 "$ROUNDS"); do
  echo "hopbench: round $round of $ROUNDS" >&2
  for i in $(seq 0 $((n - 1))); do
    p=${PATHS[$(((i + round) % n))]}
    out=$(wrk -t1 -c1 -d"${DUR}s" --latency -s "$W/post.lua" "${URL[$p]}/v1/embeddings")
    grep -q 'Non-2xx' <<<"$out" && { echo "hopbench: $p answered non-2xx at c=1:" >&2; echo "$out" >&2; exit 1; }
    p50=$(awk '$1=="50%"{print $2}' <<<"$out"); p99=$(awk '$1=="99%"{print $2}' <<<"$out")
    echo "$round $p lat $(us "$p50") $(us "$p99")" >>"$R"

    procs=${PROC[$p]}
    b0=$(ticks "$B_PID"); h0=0; [ -n "$procs" ] && h0=$(ticks $procs)
    out=$(wrk -t2 -c64 -d"${DUR}s" -s "$W/post.lua" "${URL[$p]}/v1/embeddings")
    b1=$(ticks "$B_PID"); h1=0; [ -n "$procs" ] && h1=$(ticks $procs)
    grep -q 'Non-2xx' <<<"$out" && echo "hopbench: $p: $(grep Non-2xx <<<"$out") at c=64" >&2
    reqs=$(awk '/requests in/{print $1}' <<<"$out"); rps=$(awk '/^Requests\/sec/{print $2}' <<<"$out")
    echo "$round $p thr $rps $(awk -v d=$((h1 - h0)) -v r="$reqs" -v hz="$HZ" 'BEGIN{print d / hz / r * 1e6}') $(awk -v d=$((b1 - b0)) -v r="$reqs" -v hz="$HZ" 'BEGIN{print d / hz / r * 1e6}')" >>"$R"
  done
done

# The table: medians over the rounds; "added" is the path's figure minus
# direct's of the same round.
awk -v paths="${PATHS[*]}" -v rounds="$ROUNDS" '
function median(a, n,   i, j, t) {
  for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$3 == "lat" { p50[$1, $2] = $4; p99[$1, $2] = $5 }
$3 == "thr" { rps[$1, $2] = $4; hop[$1, $2] = $5; bcpu[$1, $2] = $6 }
END {
  np = split(paths, P, " ")
  printf "| path | p50 c=1 (µs) | added p50 | p99 c=1 (µs) | added p99 | req/s c=64 | × direct | hop CPU/req (µs) | B CPU/req (µs) |\n"
  printf "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
  for (k = 1; k <= np; k++) {
    p = P[k]
    for (r = 1; r <= rounds; r++) {
      a[r] = p50[r, p]; b[r] = p50[r, p] - p50[r, "direct"]; c[r] = p99[r, p]; d[r] = p99[r, p] - p99[r, "direct"]
      e[r] = rps[r, p]; f[r] = rps[r, p] / rps[r, "direct"]; g[r] = hop[r, p]; h[r] = bcpu[r, p]
    }
    if (p == "direct")
      printf "| %s | %.0f | – | %.0f | – | %.0f | 1.00 | – | %.0f |\n", p, median(a, rounds), median(c, rounds), median(e, rounds), median(h, rounds)
    else
      printf "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.0f | %.0f |\n", p, median(a, rounds), median(b, rounds), median(c, rounds), median(d, rounds), median(e, rounds), median(f, rounds), median(g, rounds), median(h, rounds)
  }
  # The targets, as ratios of the same round: the mesh hop against nginx
  # (CPU per request, throughput) and HAProxy (added p50); median and range
  # over the rounds.
  print ""
  for (k = 1; k <= np; k++) {
    p = P[k]
    if (p == "mesh" || p == "direct") continue
    for (r = 1; r <= rounds; r++) {
      a[r] = hop[r, "mesh"] / hop[r, p]; b[r] = rps[r, "mesh"] / rps[r, p]
      c[r] = (p50[r, "mesh"] - p50[r, "direct"]) / (p50[r, p] - p50[r, "direct"])
    }
    lo_a = a[1]; hi_a = a[1]; lo_b = b[1]; hi_b = b[1]; lo_c = c[1]; hi_c = c[1]
    for (r = 2; r <= rounds; r++) {
      if (a[r] < lo_a) lo_a = a[r]; if (a[r] > hi_a) hi_a = a[r]
      if (b[r] < lo_b) lo_b = b[r]; if (b[r] > hi_b) hi_b = b[r]
      if (c[r] < lo_c) lo_c = c[r]; if (c[r] > hi_c) hi_c = c[r]
    }
    printf "mesh vs %s, same round: hop CPU %.2f× (%.2f–%.2f), throughput c=64 %.2f× (%.2f–%.2f), added p50 %.2f× (%.2f–%.2f)\n", p, median(a, rounds), lo_a, hi_a, median(b, rounds), lo_b, hi_b, median(c, rounds), lo_c, hi_c
  }
}' "$R"
echo
echo "$(nproc) cores; ${ROUNDS} rounds of ${DUR} s per measurement; wrk $(wrk -v 2>&1 | awk 'NR==1{print $2}'); B serves $MODEL." 
