package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// liveEvent is one server event of a live transcription session, with the
// time it arrived.
type liveEvent struct {
	Type       string `json:"type"`
	ItemID     string `json:"item_id"`
	Delta      string `json:"delta"`
	Transcript string `json:"transcript"`
	at         time.Time
}

// liveDial opens a live transcription session on p; key travels as
// "header", "subprotocol" or "query" (or not at all for "").
func liveDial(ctx context.Context, p *proc, query, key, how string) (*websocket.Conn, *http.Response, error) {
	u := "ws://" + p.addr + "/v1/audio/transcriptions/stream?" + query
	opts := &websocket.DialOptions{HTTPHeader: http.Header{}}
	switch how {
	case "header":
		opts.HTTPHeader.Set("Authorization", "Bearer "+key)
	case "subprotocol":
		opts.Subprotocols = []string{"infermesh.live", "infermesh.key." + key}
	case "query":
		u += "&api_key=" + url.QueryEscape(key)
	}
	return websocket.Dial(ctx, u, opts)
}

// liveSession streams one clip (PCM16 at 16 kHz, 100 ms per message, as
// binary frames or as input_audio_buffer.append events), then a second of
// silence, then session.close, and collects every event until the server
// closes. sent is when the clip's last frame left.
func liveSession(t *testing.T, ctx context.Context, conn *websocket.Conn, pcm []byte, asJSON bool) (evs []liveEvent, sent time.Time, closeErr error) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, b, err := conn.Read(ctx)
			if err != nil {
				closeErr = err
				return
			}
			var ev liveEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				t.Errorf("event %q: %v", b, err)
			}
			ev.at = time.Now()
			evs = append(evs, ev)
		}
	}()
	send := func(b []byte) {
		if asJSON {
			msg, _ := json.Marshal(map[string]string{"type": "input_audio_buffer.append", "audio": base64.StdEncoding.EncodeToString(b)})
			if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
				t.Errorf("write: %v", err)
			}
			return
		}
		if err := conn.Write(ctx, websocket.MessageBinary, b); err != nil {
			t.Errorf("write: %v", err)
		}
	}
	const chunk = 3200 // 100 ms at 16 kHz
	// LIVE_REALTIME=1 paces the frames like a microphone, for a latency
	// measurement that does not include audio queued ahead of the server.
	pace := func() {}
	if os.Getenv("LIVE_REALTIME") != "" {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		pace = func() { <-tick.C }
	}
	for i := 0; i < len(pcm); i += chunk {
		pace()
		send(pcm[i:min(i+chunk, len(pcm))])
	}
	sent = time.Now()
	silence := make([]byte, chunk)
	for range 10 {
		pace()
		send(silence)
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte(`{"type":"session.close"}`)); err != nil {
		t.Errorf("session.close: %v", err)
	}
	<-done
	return evs, sent, closeErr
}

// wavPCM returns the PCM bytes of a 16 kHz mono 16-bit WAV file.
func wavPCM(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := 12
	for i+8 <= len(b) {
		id, n := string(b[i:i+4]), int(b[i+4])|int(b[i+5])<<8|int(b[i+6])<<16|int(b[i+7])<<24
		if id == "data" {
			return b[i+8 : min(i+8+n, len(b))]
		}
		i += 8 + n + n%2
	}
	t.Fatalf("%s: no data chunk", path)
	return nil
}

// TestLiveTranscriptionThroughMesh streams the LibriVox clips over a
// WebSocket to a node that holds no speech model; the holder runs Silero
// VAD and Whisper.
func TestLiveTranscriptionThroughMesh(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	start := func(id, ip, join string, models []string) *proc {
		args := []string{"--listen", "0.0.0.0:0", "--advertise", ip, "--gossip-listen", ip + ":17946", "--rpc-listen", ip + ":17947",
			"--cluster-secret", meshSecret, "--fast-timers"}
		if join != "" {
			args = append(args, "--join", join)
		}
		p := startNodeArgs(t, id, models, args...)
		_, port, _ := net.SplitHostPort(p.addr)
		p.addr = net.JoinHostPort(ip, port)
		return p
	}
	holder := start("live-a", "127.0.47.1", "", []string{"whisper-base", "silero-vad"})
	entry := start("live-b", "127.0.47.2", "127.0.47.1:17946", nil)
	eventuallyEvery(t, 60*time.Second, 2*time.Second, "admin key usable and the model visible on the entry node", func() error {
		for _, p := range []*proc{holder, entry} {
			if code, c := keyed(p, adminKey, "GET", "/v1/models/onnx/whisper/base", nil); code != 200 {
				return fmt.Errorf("%s: %d %s", p.id, code, c)
			}
		}
		return nil
	})
	const model = "onnx/whisper/base"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// No key: 401 before any upgrade.
	_, resp, err := liveDial(ctx, entry, "model="+model, "", "")
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %v, %+v", err, resp)
	}
	// Bad parameters are HTTP errors too, from the serving node.
	_, resp, err = liveDial(ctx, entry, "model="+model+"&sample_rate=4000", adminKey, "header")
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Service-Backend") != "live-a" {
		t.Fatalf("bad sample_rate: %v, %+v", err, resp)
	}

	refs := librivoxClips(t)
	ids := make([]string, 0, len(refs))
	for id := range refs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	errs, words, deltas := 0, 0, 0
	var latencies []time.Duration
	for n, id := range ids {
		how := []string{"header", "subprotocol", "query"}[n%3]
		asJSON := n == 1
		q := "model=" + url.QueryEscape(model) + "&language=en"
		if asJSON {
			q += "&sample_rate=16000" // base64 audio at 16 kHz instead of 24
		}
		conn, resp, err := liveDial(ctx, entry, q, adminKey, how)
		if err != nil {
			t.Fatalf("%s: dial (%s key): %v", id, how, err)
		}
		if b := resp.Header.Get("X-Service-Backend"); b != "live-a" {
			t.Errorf("%s: X-Service-Backend %q, want live-a", id, b)
		}
		if how == "subprotocol" && conn.Subprotocol() != "infermesh.live" {
			t.Errorf("%s: subprotocol %q", id, conn.Subprotocol())
		}
		conn.SetReadLimit(1 << 20)
		evs, sent, cerr := liveSession(t, ctx, conn, wavPCM(t, filepath.Join(librivox, id+".wav")), asJSON)
		if st := websocket.CloseStatus(cerr); st != websocket.StatusNormalClosure {
			t.Errorf("%s: closed with %v", id, cerr)
		}
		count := map[string]int{}
		var text []string
		var last time.Time
		for _, ev := range evs {
			count[ev.Type]++
			switch ev.Type {
			case "conversation.item.input_audio_transcription.completed":
				text = append(text, ev.Transcript)
				last = ev.at
			case "error":
				t.Errorf("%s: error event %+v", id, ev)
			}
		}
		deltas += count["conversation.item.input_audio_transcription.delta"]
		if count["input_audio_buffer.speech_started"] == 0 || count["input_audio_buffer.speech_started"] != count["input_audio_buffer.speech_stopped"] ||
			count["conversation.item.input_audio_transcription.completed"] != count["input_audio_buffer.speech_stopped"] {
			t.Errorf("%s: events %v", id, count)
		}
		hyp := strings.Join(text, " ")
		e := wordErrors(normWords(refs[id]), normWords(hyp))
		errs, words = errs+e, words+len(normWords(refs[id]))
		if !last.IsZero() {
			latencies = append(latencies, last.Sub(sent))
		}
		t.Logf("%s (%s key, json=%v): %d utterances, %d deltas, %q (%d errors), last completed %v after the last speech frame",
			id, how, asJSON, count["conversation.item.input_audio_transcription.completed"],
			count["conversation.item.input_audio_transcription.delta"], hyp, e, last.Sub(sent).Round(time.Millisecond))
	}
	if wer := float64(errs) / float64(words); wer > 0.10 {
		t.Errorf("word error rate %.3f (%d/%d) over the clips, want <= 0.10", wer, errs, words)
	} else {
		t.Logf("word error rate %.3f (%d/%d)", wer, errs, words)
	}
	if deltas == 0 {
		t.Error("no partial transcript (delta) in any session")
	}
	if len(latencies) > 0 {
		slices.Sort(latencies)
		p := func(q float64) time.Duration { return latencies[min(len(latencies)-1, int(q*float64(len(latencies))))] }
		t.Logf("end of speech → completed over %d clips: p50 %v, p99 %v (measurement, not asserted)", len(latencies), p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond))
	}

	// Bad input closes with a clear code; the key travels in the query.
	bad := []struct {
		name string
		typ  websocket.MessageType
		msg  []byte
		want websocket.StatusCode
	}{
		{"odd-length binary", websocket.MessageBinary, []byte{1, 2, 3}, websocket.StatusInvalidFramePayloadData},
		{"unknown event", websocket.MessageText, []byte(`{"type":"response.create"}`), websocket.StatusUnsupportedData},
		{"bad base64", websocket.MessageText, []byte(`{"type":"input_audio_buffer.append","audio":"@@not base64@@"}`), websocket.StatusInvalidFramePayloadData},
		{"not JSON", websocket.MessageText, []byte(`hello`), websocket.StatusInvalidFramePayloadData},
		{"oversize message", websocket.MessageBinary, make([]byte, 300<<10), websocket.StatusMessageTooBig},
	}
	for _, b := range bad {
		conn, _, err := liveDial(ctx, entry, "model="+url.QueryEscape(model), adminKey, "query")
		if err != nil {
			t.Fatalf("%s: dial: %v", b.name, err)
		}
		go conn.Write(ctx, b.typ, b.msg) // may fail once the server closes
		_, _, err = conn.Read(ctx)
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != b.want || ce.Reason == "" && b.want != websocket.StatusMessageTooBig {
			t.Errorf("%s: %v, want close %d with a reason", b.name, err, b.want)
		} else {
			t.Logf("%s: close %d %q", b.name, ce.Code, ce.Reason)
		}
		conn.CloseNow()
	}
}
