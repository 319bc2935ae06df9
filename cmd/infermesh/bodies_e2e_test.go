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
// keep the node's memory within the body budget: those that do not fit
// are refused 503 with Retry-After before anything is read.
func TestStalledLargeBodiesStayInBudget(t *testing.T) {
	const budget = 256 << 20
	p := startNodeArgs(t, "big-bodies", nil, "--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
		"--body-budget", strconv.Itoa(budget))
	base := rssBytes(t, p.cmd.Process.Pid)
	const conns, declared, sent = 60, 32 << 20, 31 << 20
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 'a'
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused, held := 0, 0
	var open []net.Conn
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Error(err)
				return
			}
			fmt.Fprintf(c, "POST /v1/vision/background HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared)
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			// A refusal comes before the body is read.
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.SetReadDeadline(time.Time{})
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(line, " 503 ") {
				refused++
				c.Close()
				return
			}
			held++
			open = append(open, c)
			go func() {
				for n := 0; n < sent; n += len(chunk) {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}()
	}
	wg.Wait()
	// Let the held bodies arrive (31 MB each over loopback), then measure.
	time.Sleep(5 * time.Second)
	rss := rssBytes(t, p.cmd.Process.Pid)
	t.Logf("held %d, refused %d; RSS %d MiB at start, %d MiB with the bodies stalled (budget %d MiB)", held, refused, base>>20, rss>>20, budget>>20)
	for _, c := range open {
		c.Close()
	}
	if refused == 0 || held == 0 {
		t.Fatalf("held %d refused %d: want some of each with a %d MiB budget", held, refused, budget>>20)
	}
	if limit := base + 2*int64(budget); rss > limit {
		t.Fatalf("RSS %d MiB over the bound %d MiB (start + 2 x budget)", rss>>20, limit>>20)
	}
	resp, err := http.Get(p.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
