package limits

import (
	"container/list"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

const bucketShards = 16

// buckets holds per-name token buckets for a requests-per-minute limit: a
// bucket holds rpm tokens and refills rpm per minute. The map is sharded
// and each shard forgets its least recently used bucket beyond its share
// of the bound.
type buckets struct {
	shards [bucketShards]bucketShard
}

type bucketShard struct {
	mu    sync.Mutex
	max   int
	byKey map[string]*list.Element
	lru   list.List // of *bucket, most recent first
}

type bucket struct {
	key string
	rpm int64
	lim *rate.Limiter
}

func newBuckets(max int) *buckets {
	b := &buckets{}
	per := max / bucketShards
	if per < 1 {
		per = 1
	}
	for i := range b.shards {
		b.shards[i].max = per
		b.shards[i].byKey = map[string]*list.Element{}
	}
	return b
}

func shardOf(key string) int {
	// FNV-1a, inline so the hot path does not allocate.
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % bucketShards)
}

func perMinute(rpm int64) rate.Limit { return rate.Limit(float64(rpm) / 60) }

func (b *buckets) limiter(key string, rpm int64, now time.Time) *rate.Limiter {
	s := &b.shards[shardOf(key)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if el := s.byKey[key]; el != nil {
		s.lru.MoveToFront(el)
		bk := el.Value.(*bucket)
		if bk.rpm != rpm {
			bk.rpm = rpm
			bk.lim.SetLimitAt(now, perMinute(rpm))
			bk.lim.SetBurstAt(now, int(rpm))
		}
		return bk.lim
	}
	if s.lru.Len() >= s.max {
		oldest := s.lru.Back()
		s.lru.Remove(oldest)
		delete(s.byKey, oldest.Value.(*bucket).key)
	}
	bk := &bucket{key: key, rpm: rpm, lim: rate.NewLimiter(perMinute(rpm), int(rpm))}
	s.byKey[key] = s.lru.PushFront(bk)
	return bk.lim
}

// reserve takes one token from key's bucket. When none is available it
// takes nothing and returns how long until one is.
func (b *buckets) reserve(key string, rpm int64, now time.Time) (*rate.Reservation, time.Duration) {
	r := b.limiter(key, rpm, now).ReserveN(now, 1)
	if !r.OK() {
		return nil, time.Minute
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return nil, d
	}
	return r, 0
}

func (b *buckets) size() int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// clientKey groups a client address: IPv6 by its /64, others as given.
func clientKey(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	switch {
	case ip.Is4In6():
		return ip.Unmap().String()
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return addr
}
