package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowBody opens a connection that sends a request head declaring size
// bytes and then one body byte a second, until the server ends the
// exchange. It returns the status line the server answered with ("" if
// it only closed).
func slowBody(addr, path string, size int, stop <-chan struct{}) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", path, size)
	done := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(c).ReadString('\n')
		done <- strings.TrimSpace(line)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case line := <-done:
			return line, nil
		case <-stop:
			return "", fmt.Errorf("still open at the end")
		case <-tick.C:
			c.Write([]byte(" "))
		}
	}
}

// 500 connections trickling bodies are cut by the minimum-rate deadline,
// and the node serves other requests meanwhile.
func TestSlowBodiesAreCut(t *testing.T) {
	p := startNodeArgs(t, "slow-bodies", nil, "--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
		"--body-grace", "2s", "--body-min-rate", "4096")
	const conns = 500
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[string]int{}
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line, err := slowBody(p.addr, "/v1/embeddings", 100000, stop)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				statuses["error: "+err.Error()]++
				return
			}
			statuses[line]++
		}()
	}
	// Served meanwhile: a listing and a bad embeddings request (its body
	// arrives at once).
	for i := 0; i < 5; i++ {
		resp, err := http.Get(p.url("/v1/models"))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("models list during the slow bodies: %v %v", resp, err)
		}
		resp.Body.Close()
		resp, err = http.Post(p.url("/v1/embeddings"), "application/json", strings.NewReader(`{"model":"nope","input":"x"}`))
		if err != nil || resp.StatusCode != 404 {
			t.Fatalf("embeddings during the slow bodies: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	// Hang guard only: the deadline is 2 s + 16 s per 64 KiB here.
	guard := time.AfterFunc(3*time.Minute, func() { close(stop) })
	wg.Wait()
	guard.Stop()
	t.Logf("slow-body outcomes: %v", statuses)
	if statuses["HTTP/1.1 408 Request Timeout"] != conns {
		t.Fatalf("want all %d slow bodies answered 408, got %v", conns, statuses)
	}
}

// rssBytes reads a process's resident set size, failing t if it cannot.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	n, ok := readRSS(pid)
	if !ok {
		t.Fatalf("no VmRSS for pid %d", pid)
	}
	return n
}

// readRSS reads a process's resident set size; false once the process is
// gone (safe to call from any goroutine).
func readRSS(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, true
		}
	}
	return 0, false
}

// 60 connections each sending 31 MB of a 32 MB image body and stalling
// keep the node's memory within the body budget: bodies are charged as
// they arrive, and those that would cross the budget are refused 503 with
// Retry-After while they arrive (the share is the whole budget here, so
// the node-wide budget is what refuses them). Arriving side by side, most
// or all of them are refused.
func TestStalledLargeBodiesStayInBudget(t *testing.T) {
	const budget = 256 << 20
	p := startNodeArgs(t, "big-bodies", nil, "--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
		"--body-budget", strconv.Itoa(budget), "--body-share", strconv.Itoa(budget), "--body-grace", "60s")
	base := rssBytes(t, p.cmd.Process.Pid)
	const conns, declared, sent = 60, 32 << 20, 31 << 20
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 'a'
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := 0
	var open []net.Conn
	for i := 0; i < conns; i++ {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		fmt.Fprintf(c, "POST /v1/vision/background HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < sent; n += len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
		go func() {
			// A refusal comes while the body arrives.
			line, _ := bufio.NewReader(c).ReadString('\n')
			if strings.Contains(line, " 503 ") {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		}()
	}
	// Writers end when their 31 MB are in or their connection is refused.
	wg.Wait()
	rss := rssBytes(t, p.cmd.Process.Pid)
	mu.Lock()
	held := conns - refused
	mu.Unlock()
	t.Logf("held %d, refused %d; RSS %d MiB at start, %d MiB with the bodies stalled (budget %d MiB)", held, refused, base>>20, rss>>20, budget>>20)
	for _, c := range open {
		c.Close()
	}
	if refused == 0 {
		t.Fatalf("held %d refused %d: want refusals with a %d MiB budget", held, refused, budget>>20)
	}
	// The live bytes stay within the budget; Go's collector lets the heap
	// grow to twice the live bytes before it collects the refused bodies'
	// chunks, hence the bound.
	if limit := base + 3*int64(budget); rss > limit {
		t.Fatalf("RSS %d MiB over the bound %d MiB (start + 3 x budget)", rss>>20, limit>>20)
	}
	resp, err := http.Get(p.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
