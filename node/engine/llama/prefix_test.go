package llama

import (
	"context"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// TestPrefixCacheFollowUp: the next turn of a conversation copies the
// earlier turn's cached keys and values (prompt and answer) into its
// sequence and prefills only the new tokens, and its greedy answer equals
// the one computed with the cache off; LRU eviction keeps the cache
// within its budget.
func TestPrefixCacheFollowUp(t *testing.T) {
	on := loadTiny(t, map[string]string{"prefix_cache_tokens": "1024"})
	off := loadTiny(t, map[string]string{"prefix_cache_tokens": "0"})
	long := strings.Repeat("The mesh is a group of small computers that answer questions together. ", 12)
	turn1 := engine.ChatRequest{Messages: user(long), MaxTokens: 20, Temperature: greedy()}
	first, err := on.Chat(context.Background(), turn1, nil)
	if err != nil {
		t.Fatal(err)
	}
	follow := engine.ChatRequest{Messages: []engine.ChatMessage{
		{Role: engine.RoleUser, Content: long},
		{Role: engine.RoleAssistant, Content: first.Message.Content},
		{Role: engine.RoleUser, Content: "And then?"},
	}, MaxTokens: 20, Temperature: greedy()}
	before := on.PrefixStats()
	got, err := on.Chat(context.Background(), follow, nil)
	if err != nil {
		t.Fatal(err)
	}
	after := on.PrefixStats()
	hit := after.HitTokens - before.HitTokens
	if hit < uint64(first.Usage.PromptTokens) {
		t.Fatalf("follow-up hit %d tokens, want at least the first prompt's %d (stats %+v)", hit, first.Usage.PromptTokens, after)
	}
	want, err := off.Chat(context.Background(), follow, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Message.Content != want.Message.Content {
		t.Fatalf("with the cache %q, without %q", got.Message.Content, want.Message.Content)
	}
	if st := off.PrefixStats(); st.Lookups != 0 {
		t.Fatalf("disabled cache counted %+v", st)
	}
	// Many different conversations: the cache stays within its budget.
	for i := range 12 {
		_, err := on.Chat(context.Background(), engine.ChatRequest{Messages: user(strings.Repeat(string(rune('a'+i))+" word ", 60)), MaxTokens: 4, Temperature: greedy()}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	st := on.PrefixStats()
	if st.Evictions == 0 || st.Bytes > st.BudgetBytes || st.Blocks > defaultPrefixSequences {
		t.Fatalf("after 12 conversations: %+v", st)
	}
	t.Logf("stats %+v", st)
}
