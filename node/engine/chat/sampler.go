package chat

import (
	"math"
	"math/rand/v2"
	"slices"
)

// SamplingParams are the request's sampling settings.
type SamplingParams struct {
	// Temperature 0 is greedy decoding (argmax, lowest id on ties).
	Temperature float64
	// TopP in (0, 1]: sample from the smallest set of most likely tokens
	// whose probabilities reach TopP.
	TopP float64
	// Seed feeds the random source: the same seed, logits and mask give
	// the same choices.
	Seed uint64
	// PresencePenalty is subtracted once from the logit of every token
	// already generated (OpenAI's definition).
	PresencePenalty float64
	// FrequencyPenalty is subtracted from a token's logit once per time it
	// was generated (OpenAI's definition).
	FrequencyPenalty float64
}

// Sampler picks the next token from logits. It is used by one generation
// at a time.
type Sampler struct {
	p      SamplingParams
	rng    *rand.Rand
	limit  int           // ids at or above it are never picked
	counts map[int64]int // generated tokens, for the penalties
	cand   []candidateP  // scratch for top-p
}

type candidateP struct {
	id int
	p  float64
}

// NewSampler builds a sampler over ids [0, limit).
func NewSampler(p SamplingParams, limit int) *Sampler {
	if p.TopP <= 0 || p.TopP > 1 {
		p.TopP = 1
	}
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, 0x9E3779B97F4A7C15)), limit: limit, counts: map[int64]int{}}
}

// Accept records a generated token for the penalties.
func (s *Sampler) Accept(id int64) { s.counts[id]++ }

// value is the penalised logit of id.
func (s *Sampler) value(logits []float32, id int) float64 {
	v := float64(logits[id])
	if c := s.counts[int64(id)]; c > 0 {
		v -= s.p.PresencePenalty + float64(c)*s.p.FrequencyPenalty
	}
	return v
}

// Sample returns the next token: among ids allowed by mask (nil: all ids
// below the limit), greedily at temperature 0, else from the
// temperature-scaled softmax cut to top-p. It returns -1 when no id is
// allowed.
func (s *Sampler) Sample(logits []float32, mask []bool) int64 {
	n := min(len(logits), s.limit)
	allowed := func(i int) bool { return mask == nil || i < len(mask) && mask[i] }
	hasPenalty := s.p.PresencePenalty != 0 || s.p.FrequencyPenalty != 0
	val := func(i int) float64 {
		if hasPenalty {
			return s.value(logits, i)
		}
		return float64(logits[i])
	}
	best, bestV := -1, math.Inf(-1)
	for i := range n {
		if !allowed(i) {
			continue
		}
		if v := val(i); best < 0 || v > bestV {
			best, bestV = i, v
		}
	}
	if best < 0 || s.p.Temperature <= 0 || math.IsInf(bestV, 0) || math.IsNaN(bestV) {
		return int64(best)
	}
	inv := 1 / s.p.Temperature
	if s.p.TopP >= 1 {
		sum := 0.0
		for i := range n {
			if allowed(i) {
				sum += math.Exp((val(i) - bestV) * inv)
			}
		}
		u := s.rng.Float64() * sum
		last := best
		for i := range n {
			if !allowed(i) {
				continue
			}
			last = i
			if u -= math.Exp((val(i) - bestV) * inv); u < 0 {
				return int64(i)
			}
		}
		return int64(last)
	}
	// Top-p: tokens below 1e-12 of the best one cannot change the set.
	s.cand = s.cand[:0]
	sum := 0.0
	for i := range n {
		if !allowed(i) {
			continue
		}
		p := math.Exp((val(i) - bestV) * inv)
		if p < 1e-12 {
			continue
		}
		s.cand = append(s.cand, candidateP{i, p})
		sum += p
	}
	slices.SortFunc(s.cand, func(a, b candidateP) int {
		switch {
		case a.p > b.p:
			return -1
		case a.p < b.p:
			return 1
		}
		return a.id - b.id
	})
	keep, mass := 0, 0.0
	for keep < len(s.cand) {
		mass += s.cand[keep].p
		keep++
		if mass >= s.p.TopP*sum {
			break
		}
	}
	u := s.rng.Float64() * mass
	for _, c := range s.cand[:keep] {
		if u -= c.p; u < 0 {
			return int64(c.id)
		}
	}
	return int64(s.cand[keep-1].id)
}
