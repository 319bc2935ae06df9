package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/engine"
)

// chatCollector exports the continuous-batching and prefix-cache counters
// of every loaded local chat model, read at scrape time.
type chatCollector struct {
	e *engines

	running, queued, kvBytes         *prometheus.Desc
	steps, stepRows, prefill, refuse *prometheus.Desc
	lookups, hitTokens, missTokens   *prometheus.Desc
	evictions, cacheBytes, budget    *prometheus.Desc
}

func newChatCollector(e *engines) *chatCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("infermesh_chat_"+name, help, []string{"model"}, nil)
	}
	return &chatCollector{
		e:          e,
		running:    d("batch_running", "Sequences decoding in the model's batch."),
		queued:     d("batch_queued", "Requests waiting for a batch slot."),
		kvBytes:    d("batch_kv_bytes", "Estimated KV cache bytes of the running batch."),
		steps:      d("batch_steps_total", "Batched decode steps run."),
		stepRows:   d("batch_step_rows_total", "Sequences summed over decode steps (rows / steps = mean batch size)."),
		prefill:    d("prefill_chunks_total", "Prompt prefill chunks run."),
		refuse:     d("batch_refused_total", "Requests refused because the batch and its queue were full."),
		lookups:    d("prefix_cache_lookups_total", "Prompts looked up in the prefix cache."),
		hitTokens:  d("prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache."),
		missTokens: d("prefix_cache_miss_tokens_total", "Prompt tokens prefilled because the cache did not hold them."),
		evictions:  d("prefix_cache_evictions_total", "Cached prefix blocks evicted."),
		cacheBytes: d("prefix_cache_bytes", "Bytes held by the prefix cache."),
		budget:     d("prefix_cache_budget_bytes", "The prefix cache's memory budget."),
	}
}

// Describe implements prometheus.Collector.
func (c *chatCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.queued, c.kvBytes, c.steps, c.stepRows, c.prefill, c.refuse,
		c.lookups, c.hitTokens, c.missTokens, c.evictions, c.cacheBytes, c.budget} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *chatCollector) Collect(ch chan<- prometheus.Metric) {
	c.e.mu.RLock()
	chats := map[string]engine.BatchingChatter{}
	for id, eng := range c.e.loaded {
		if b, ok := eng.(engine.BatchingChatter); ok {
			chats[id] = b
		}
	}
	c.e.mu.RUnlock()
	g := func(d *prometheus.Desc, v float64, id string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, id)
	}
	k := func(d *prometheus.Desc, v uint64, id string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), id)
	}
	for id, b := range chats {
		bs, ps := b.BatchStats(), b.PrefixStats()
		g(c.running, float64(bs.Running), id)
		g(c.queued, float64(bs.Queued), id)
		g(c.kvBytes, float64(bs.KVBytes), id)
		k(c.steps, bs.Steps, id)
		k(c.stepRows, bs.StepRows, id)
		k(c.prefill, bs.PrefillChunks, id)
		k(c.refuse, bs.Refused, id)
		k(c.lookups, ps.Lookups, id)
		k(c.hitTokens, ps.HitTokens, id)
		k(c.missTokens, ps.MissTokens, id)
		k(c.evictions, ps.Evictions, id)
		g(c.cacheBytes, float64(ps.Bytes), id)
		g(c.budget, float64(ps.BudgetBytes), id)
	}
}
