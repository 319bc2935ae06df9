package limits

import (
	"strings"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/auth"
)

// Defaults of Config.
const (
	DefaultTrackedBuckets      = 100_000
	DefaultLeaseTimeout        = 5 * time.Second
	DefaultRetryBackoff        = time.Second
	DefaultRecheckExhausted    = 5 * time.Second
	DefaultSliceFraction       = 16
	DefaultFlushInterval       = time.Second
	DefaultFlushEntries        = 256
	DefaultOutputTokens        = 256
	DefaultMaintainInterval    = time.Second
	DefaultUnavailableRetryFor = 2 // seconds of Retry-After on 503 quota_unavailable
)

// Config configures a Limiter. Zero values take the defaults above.
type Config struct {
	// KeyRPM is the server-wide requests-per-minute limit of keys that set
	// none of their own; zero means none.
	KeyRPM int64
	// ClientRPM limits each client address (IPv6 by /64); zero means none.
	ClientRPM int64
	// TrackedBuckets bounds each of the key and client bucket maps; the
	// least recently used bucket is forgotten first (a bucket idle for a
	// minute is full anyway, so forgetting it changes nothing).
	TrackedBuckets int

	// LeaseTTL is asked for with each lease (default
	// consensus.DefaultLeaseTTL). Active holdings are renewed at half of
	// it; holdings idle for a quarter of it are returned.
	LeaseTTL time.Duration
	// LeaseTimeout bounds one lease or usage command (default 5s).
	LeaseTimeout time.Duration
	// RetryBackoff is how long after a failed lease command the node only
	// serves what it holds before asking the leader again (default 1s).
	RetryBackoff time.Duration
	// RecheckExhausted is how long a "nothing left" answer is trusted
	// before the leader is asked again (default 5s); meanwhile refusals
	// cost no raft entry.
	RecheckExhausted time.Duration
	// SliceFraction sets the lease slice: limit/SliceFraction, at most a
	// quarter of what the leader says remains, at least what the request
	// needs (default 16).
	SliceFraction int64

	// FlushInterval and FlushEntries: usage is sent as one raft entry per
	// FlushInterval (default 1s) or as soon as FlushEntries requests
	// (default 256) were recorded, whichever comes first.
	FlushInterval time.Duration
	FlushEntries  int // see FlushInterval
	// MaintainInterval is the period of lease upkeep: renewals, returns of
	// idle holdings, settlements of past periods (default 1s).
	MaintainInterval time.Duration

	// Prices gives per-model prices for budgets and usage costs; nil
	// prices nothing, so budgets never bind.
	Prices Prices
	// DefaultOutputTokens estimates output when a request names no cap
	// (default 256); the real count is charged when the ticket is done.
	DefaultOutputTokens int64
	// Gate, when set, is entered by admitted chat, embeddings, images,
	// audio and vision requests (and forwarded ones) until Ticket.Done.
	Gate *Gate

	// Plan reads the replicated plan settings; nil is Pro (no Free
	// allowance).
	Plan PlanSource
	// FreeAllowanceKey is the ledger the daily Free allowance is leased
	// from (default FreeAllowanceKeyID, which consensus reserves).
	FreeAllowanceKey string
	// ThirdPartyTools are the User-Agent products that class keyless
	// callers as third-party (nil: DefaultThirdPartyTools()).
	ThirdPartyTools []string
}

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.TrackedBuckets <= 0 {
		c.TrackedBuckets = DefaultTrackedBuckets
	}
	def(&c.LeaseTTL, consensus.DefaultLeaseTTL)
	def(&c.LeaseTimeout, DefaultLeaseTimeout)
	def(&c.RetryBackoff, DefaultRetryBackoff)
	def(&c.RecheckExhausted, DefaultRecheckExhausted)
	def(&c.FlushInterval, DefaultFlushInterval)
	def(&c.MaintainInterval, DefaultMaintainInterval)
	if c.SliceFraction <= 0 {
		c.SliceFraction = DefaultSliceFraction
	}
	if c.FlushEntries <= 0 {
		c.FlushEntries = DefaultFlushEntries
	}
	if c.FreeAllowanceKey == "" {
		c.FreeAllowanceKey = FreeAllowanceKeyID
	}
	if c.DefaultOutputTokens <= 0 {
		c.DefaultOutputTokens = DefaultOutputTokens
	}
	return c
}

// Prices finds a model's price. The node implements it over the replicated
// policy (ConsensusPrices).
type Prices interface {
	// Price returns the model's price by model id; false means it has no
	// price, so its requests count against no budget.
	Price(model string) (consensus.Price, bool)
}

// Request is what Admit needs to know about one request.
type Request struct {
	// Caller is the authenticated caller (auth.CallerFrom).
	Caller auth.Caller
	// ClientAddr is the client's IP, as auth got it.
	ClientAddr string
	// Class is auth.Classify of the request.
	Class auth.Class
	// Counted is auth.Counted of the request; uncounted requests are
	// admitted at once and record nothing.
	Counted bool
	// Model is the model id, for prices and usage.
	Model string
	// Priority from the X-Service-Priority header (ParsePriority).
	Priority Priority
	// Batch marks work of a batch job (its submission, or a job's request
	// forwarded to a peer): it runs as Background at most.
	Batch bool
	// UserAgent is the request's User-Agent, which classes keyless
	// callers first- or third-party on the Free plan (Classify).
	UserAgent string
	// InputTokens estimates the prompt, for the budget estimate.
	InputTokens int64
	// MaxOutputTokens is the request's output cap; zero uses
	// Config.DefaultOutputTokens for the estimate.
	MaxOutputTokens int64
}

// Usage is what a finished request used. Counts only, never content.
type Usage struct {
	PromptTokens     int64 // input tokens
	CompletionTokens int64 // output tokens
	Status           int   // HTTP status sent; 400 and above count as errors
	// Worker is the node that served the request; empty means this node.
	Worker string
}

// PriorityHeader is the request header that can lower a request's priority.
const PriorityHeader = "X-Service-Priority"

// Priority orders work when a node is busy; lower values go first.
type Priority uint8

// Priorities.
const (
	// Interactive is people waiting: the default.
	Interactive Priority = iota
	// Background is unattended work, and batch jobs.
	Background
	// Maintenance is the lowest.
	Maintenance
)

const numPriorities = 3

// String names the priority.
func (p Priority) String() string {
	switch p {
	case Background:
		return "background"
	case Maintenance:
		return "maintenance"
	}
	return "interactive"
}

// effective is the priority the gate uses: Batch work is Background at
// most.
func (r Request) effective() Priority {
	if r.Batch && r.Priority < Background {
		return Background
	}
	return r.Priority
}

// ParsePriority reads an X-Service-Priority value. It can only lower a
// request's priority: "background" and "maintenance" (any case) count,
// anything else is Interactive.
func ParsePriority(header string) Priority {
	header = strings.TrimSpace(header)
	switch {
	case strings.EqualFold(header, "background"):
		return Background
	case strings.EqualFold(header, "maintenance"):
		return Maintenance
	}
	return Interactive
}
