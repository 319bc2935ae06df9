package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infermesh/infermesh/node/prefix"
)

// Conversation workload of TestPrefixRoutingKeepsConversations.
const (
	prefixConversations = 30
	prefixTurns         = 4 // the first turn and three follow-ups
)

// convStats is what one run of the workload measured.
type convStats struct {
	followUps, stayed int
	followUpTTFT      time.Duration // summed time to first token of follow-ups
	perNode           map[string]int
	cacheHit          float64 // prompt tokens the nodes' prefix caches served
	cacheMiss         float64 // prompt tokens the nodes prefilled
}

func (s convStats) share() float64 { return float64(s.stayed) / float64(s.followUps) }

// TestPrefixRoutingKeepsConversations serves 30 interleaved multi-turn
// conversations on a 3-process mesh, entering each request at a random
// node, once with round-robin and once with the prefix strategy, and
// reports the share of follow-up turns served by the node that served the
// previous turn (the node whose engine holds the conversation's prefix).
// It needs the dispatcher to pass the request's prefix hashes to routing
// and the chat path to record served conversations (see node/prefix).
func TestPrefixRoutingKeepsConversations(t *testing.T) {
	checkPrefixRouting(t, tinyLlamaConv, "127.0.50.", "127.0.51.")
}

// TestPrefixRoutingKeepsGGUFConversations is the same workload on the
// generated GGUF chat model (llama.cpp engine, its prefix cache on
// llama.cpp's sequence memory).
func TestPrefixRoutingKeepsGGUFConversations(t *testing.T) {
	checkPrefixRouting(t, convModel{asset: "tiny-gguf", wire: "tiny-gguf:test", id: "gguf/tiny-gguf/test"}, "127.0.92.", "127.0.93.")
}

// convModel names the chat model a conversation workload runs on.
type convModel struct{ asset, wire, id string }

var tinyLlamaConv = convModel{asset: "tiny-llama", wire: "tiny-llama:test", id: "onnx/tiny-llama/test"}

// checkPrefixRouting runs the workload with round-robin and with the
// prefix strategy on two 3-node meshes (addresses ipRR*, ipPX*) and checks
// the prefix strategy keeps follow-ups on their node.
func checkPrefixRouting(t *testing.T, model convModel, ipRR, ipPX string) {
	rr := runConversations(t, model, "round-robin", ipRR)
	px := runConversations(t, model, "prefix", ipPX)
	mean := func(s convStats) time.Duration { return s.followUpTTFT / time.Duration(s.followUps) }
	t.Logf("follow-up turns on the previous turn's node: prefix %d/%d = %.1f%%, round-robin %d/%d = %.1f%%",
		px.stayed, px.followUps, 100*px.share(), rr.stayed, rr.followUps, 100*rr.share())
	t.Logf("mean follow-up time to first token (streamed): prefix %v, round-robin %v; requests per node: prefix %v, round-robin %v",
		mean(px).Round(time.Millisecond), mean(rr).Round(time.Millisecond), px.perNode, rr.perNode)
	hitShare := func(s convStats) float64 { return s.cacheHit / max(1, s.cacheHit+s.cacheMiss) }
	t.Logf("prompt tokens served from the nodes' prefix caches: prefix %.0f%%, round-robin %.0f%%", 100*hitShare(px), 100*hitShare(rr))
	if hitShare(px) <= hitShare(rr) {
		t.Errorf("prefix routing did not raise the prefix cache's share of prompt tokens (%.2f vs %.2f)", hitShare(px), hitShare(rr))
	}
	if px.share() < 0.9 {
		t.Errorf("prefix routing kept %.1f%% of follow-ups on their node, want at least 90%%", 100*px.share())
	}
	if rr.share() > 0.6 {
		t.Errorf("round-robin kept %.1f%% of follow-ups on their node; the workload does not discriminate", 100*rr.share())
	}
	// Balance: no node serves more than half of the requests.
	for id, n := range px.perNode {
		if n > prefixConversations*prefixTurns/2 {
			t.Errorf("prefix routing sent %d of %d requests to %s", n, prefixConversations*prefixTurns, id)
		}
	}
}

// runConversations starts a 3-node mesh with the strategy and runs the
// workload on it; the nodes stop when the test ends.
func runConversations(t *testing.T, model convModel, strategy, ipPrefix string) convStats {
	t.Helper()
	var ps []*proc
	for i := 1; i <= 3; i++ {
		join := ""
		if i > 1 {
			join = ipPrefix + "1:17946"
		}
		n := meshNode{fmt.Sprintf("%s-%d", strategy, i), fmt.Sprintf("%s%d", ipPrefix, i), []string{model.asset}}
		ps = append(ps, startMeshNode(t, n, join, "--strategy", strategy))
	}
	waitMembers(t, ps, 3)

	// Capture the bodies the SDK sends, to check that a follow-up's prefix
	// hashes extend the previous turn's conversation as the serving node
	// records it.
	var mu sync.Mutex
	var lastBody []byte
	capture := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if req.Body != nil {
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return nil, err
			}
			req.Body = io.NopCloser(bytes.NewReader(b))
			mu.Lock()
			lastBody = b
			mu.Unlock()
		}
		return next(req)
	})

	ctx := context.Background()
	r := rand.New(rand.NewPCG(42, 7))
	history := make([][]openai.ChatCompletionMessageParamUnion, prefixConversations)
	served := make([]string, prefixConversations)
	recorded := make([]uint64, prefixConversations) // what the previous turn's node records last
	st := convStats{perNode: map[string]int{}}
	order := make([]int, prefixConversations)
	for i := range order {
		order[i] = i
	}
	for turn := 0; turn < prefixTurns; turn++ {
		r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, c := range order {
			if turn == 0 {
				// A long system prompt per conversation, so a follow-up on the
				// node that holds it skips a real prefill (prefix cache).
				history[c] = append(history[c], openai.SystemMessage(fmt.Sprintf("You are assistant number %d. ", c)+longSystemPrompt))
			}
			history[c] = append(history[c], openai.UserMessage(fmt.Sprintf("Conversation %d, question %d: what happens next in the story of the %d lighthouses?", c, turn, c+turn)))
			client := ps[r.IntN(len(ps))].client()
			var resp *http.Response
			start := time.Now()
			stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model: model.wire, Messages: history[c], Temperature: openai.Float(0), MaxTokens: openai.Int(8),
			}, option.WithResponseInto(&resp), capture)
			var acc openai.ChatCompletionAccumulator
			var ttft time.Duration
			for stream.Next() {
				if ttft == 0 {
					ttft = time.Since(start)
				}
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil || len(acc.Choices) != 1 {
				t.Fatalf("%s: conversation %d turn %d: %v (%d choices)", strategy, c, turn, err, len(acc.Choices))
			}
			res := acc.ChatCompletion
			backend := resp.Header.Get("X-Service-Backend")
			st.perNode[backend]++
			mu.Lock()
			body := lastBody
			mu.Unlock()
			hashes := prefix.RequestHashes(model.id, body)
			if len(hashes) != len(history[c]) {
				t.Fatalf("%s: %d prefix hashes for %d messages", strategy, len(hashes), len(history[c]))
			}
			if turn > 0 {
				st.followUps++
				st.followUpTTFT += ttft
				if backend == served[c] {
					st.stayed++
				}
				// The previous turn with its answer is a prefix of this one.
				if hashes[len(hashes)-2] != recorded[c] {
					t.Fatalf("%s: conversation %d turn %d does not extend the recorded conversation", strategy, c, turn)
				}
			}
			served[c] = backend
			msg := res.Choices[0].Message
			// The conversation with this answer, hashed as the next
			// request's body will be.
			var req map[string]any
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			req["messages"] = append(req["messages"].([]any), map[string]any{"role": "assistant", "content": msg.Content})
			next, _ := json.Marshal(req)
			all := prefix.RequestHashes(model.id, next)
			if len(all) == 0 {
				t.Fatalf("no prefix hashes for %s", next)
			}
			recorded[c] = all[len(all)-1]
			history[c] = append(history[c], msg.ToParam())
		}
		// Digests travel with the next record; let the last ones spread.
		time.Sleep(300 * time.Millisecond)
	}
	for _, p := range ps {
		hit, err := metricSum(p, "infermesh_engine_prefix_cache_tokens_total", `result="hit"`)
		if err != nil {
			t.Fatal(err)
		}
		miss, err := metricSum(p, "infermesh_engine_prefix_cache_tokens_total", `result="miss"`)
		if err != nil {
			t.Fatal(err)
		}
		st.cacheHit, st.cacheMiss = st.cacheHit+hit, st.cacheMiss+miss
	}
	return st
}

// longSystemPrompt makes every conversation start with about 900 tokens
// of instructions (the test model's tokenizer spends about a token per
// character).
var longSystemPrompt = strings.Repeat("Answer briefly, stay on the topic of lighthouses, ships and the sea, and never invent facts about real places. ", 8)
