// Package api is a node's HTTP surface: the OpenAI-compatible /v1 routes,
// /readyz, /dashboard and metrics, with the OpenAI error format, request ids
// and timing headers applied in one place. It knows nothing about memberlist,
// raft or ONNX Runtime: it talks to the node through the interfaces it
// declares (Backend, Dispatcher, Admission, Governance, ModelHub and the
// optional ones a Backend may also implement).
package api

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/audioenc"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// ErrModelNotFound is returned by a Backend for an id no node can serve.
var ErrModelNotFound = errors.New("model not found")

// ErrWrongTask is returned by a Backend when the model exists but does not
// serve the requested task.
var ErrWrongTask = errors.New("model does not serve this endpoint")

// Model is the API's view of an installed model.
type Model struct {
	// ID is the canonical id <runtime>/<family>/<variant>.
	ID string
	// WireID is the alternative id clients may use instead: <name>:<tag>,
	// or <provider>:<model> for provider models.
	WireID string
	// Runtime is the first segment of ID ("upstream" for provider models);
	// it is sent as owned_by.
	Runtime string
	// Task is the kind of work the model serves (e.g. "embeddings",
	// "chat", "background-removal").
	Task string
	// Modalities lists what the model does (embeddings, vision, chat, ...).
	Modalities []string
	// Created is when the model was installed (for provider models, when
	// the provider list was loaded), in Unix seconds.
	Created int64
	// SizeBytes is the total size of the model's files on this node, or
	// as a peer that holds it gossips it; 0 for provider models.
	SizeBytes int64
	// Warm reports whether the model is loaded on some node and serves
	// without a cold start.
	Warm bool
	// ResidentBytes estimates the memory the model holds while loaded on
	// this node (0: not loaded here); sent as resident_bytes.
	ResidentBytes int64
	// Deprecation, when set, is sent as X-AI-Model-Deprecated (the
	// replacement's id, or "true").
	Deprecation string
}

// Backend is what the API needs from its node.
type Backend interface {
	// Models lists the models some node of the mesh serves, allowed by
	// policy, sorted by id.
	Models() []Model
	// Model resolves a canonical or wire id among the mesh's models.
	Model(id string) (Model, bool)
	// Route resolves the model a routed request names (canonical or wire
	// id; "" takes the mesh's model of defaultTask, if any) and says what
	// to do with the request: serve it as the returned model, refuse it
	// (the policy blocks the model: 403 model_blocked; every node that
	// holds it is draining: 503 server_draining with Retry-After), or
	// leave it to the local handler (no node serves the model, which
	// gives the precise error).
	Route(id, defaultTask string) (Model, Verdict)
	// DefaultModel names the mesh's model for a task (used when a vision
	// request names none); "" when there is none.
	DefaultModel(task string) string
	// Embedder returns this node's embeddings engine for a model id.
	Embedder(ctx context.Context, id string) (engine.Embedder, error)
	// Chatter returns this node's chat engine for a model id.
	Chatter(ctx context.Context, id string) (engine.Chatter, error)
	// ImageGenerator returns this node's image generation engine for a
	// model id.
	ImageGenerator(ctx context.Context, id string) (engine.ImageGenerator, error)
	// TaskEngine returns this node's engine of a task for a model id and
	// the canonical id it serves; id "" asks for the node's first model of
	// the task. It returns ErrModelNotFound when no such model is
	// installed, and ErrWrongTask when the model serves another task.
	TaskEngine(ctx context.Context, task engine.Task, id string) (engine.Engine, string, error)
	// Members lists the nodes of the mesh as gossip sees them.
	Members() []Member
	// Draining reports whether the node is shutting down.
	Draining() bool
	// NotReady says why the node cannot serve keyed requests yet (its
	// copy of the replicated keys has not caught up since it started);
	// "" when it can. /readyz answers 503 with the reason while it is not
	// "". A replica that caught up stays usable when the quorum is lost.
	NotReady() string
	// WritesBlocked says why writes to the replicated state cannot commit
	// now (no raft leader); "" when they can. It does not make the node
	// unready: /readyz reports it in its "governance" field.
	WritesBlocked() string
	// Status describes the node for the dashboard; the API adds request
	// statistics to it.
	Status() NodeStatus
}

// Verdict is a Backend's answer for a routed request's model.
type Verdict int

// Verdicts of Backend.Route.
const (
	// VerdictServe: dispatch the request for the returned model.
	VerdictServe Verdict = iota
	// VerdictLocal: no node serves the model; the local handler answers.
	VerdictLocal
	// VerdictBlocked: the pool policy blocks the model.
	VerdictBlocked
	// VerdictDraining: every node that holds the model is draining.
	VerdictDraining
)

// NodeStatus is the node's own part of the dashboard's data.
type NodeStatus struct {
	// NodeID is the node id.
	NodeID string
	// State is ready or draining (the dashboard refines it).
	State string
	// Version is the node's software version.
	Version string
	// Engine is the node's engine setting.
	Engine string
	// UptimeSeconds is how long the node has served.
	UptimeSeconds int64
	// Models are the mesh's models, sorted by id.
	Models []StatusModel
	// Peers are the mesh's nodes as gossip sees them.
	Peers []Member
}

// StatusModel is one model in a NodeStatus.
type StatusModel struct {
	ID     string `json:"id"`
	WireID string `json:"wire_id"`
	Task   string `json:"task"`
	Warm   bool   `json:"warm"`
}

// Member is one node of the mesh, for /v1/server/members and the dashboard.
type Member struct {
	// ID is the node id.
	ID string `json:"id"`
	// HTTPAddr is the node's advertised client HTTP address.
	HTTPAddr string `json:"http_addr"`
	// RPCAddr is the node's internal Connect and raft address.
	RPCAddr string `json:"rpc_addr"`
	// Version is the node's software version.
	Version string `json:"version"`
	// State is the node's reported health: alive, ready, saturated,
	// draining or unknown.
	State string `json:"state"`
	// Self marks the node that answered.
	Self bool `json:"self"`
	// Ejected is set after the node refused a connection, until gossip
	// reports it ready again.
	Ejected bool `json:"ejected"`
	// InFlight is the number of requests the node is serving.
	InFlight int `json:"inflight"`
	// Cap is the node's in-flight cap; 0 means no cap.
	Cap int `json:"cap"`
	// Weight is the node's weight for the weighted strategy.
	Weight int `json:"weight"`
	// Canary marks a canary node.
	Canary bool `json:"canary"`
	// CanaryPercent is the share of callers (0-100) a canary receives.
	CanaryPercent int `json:"canary_percent"`
	// Installed lists the canonical ids of the node's models, sorted.
	Installed []string `json:"installed"`
	// Warm lists the installed models that are loaded, sorted.
	Warm []string `json:"warm"`
	// Policy is the routing policy's entry for the node (the replicated
	// policy, seeded from gateway.json); nil when it has none. Its Cap 0
	// leaves the node's own cap.
	Policy *Routing `json:"policy"`
	// Effective is how routing treats the node now: the policy's
	// settings where it sets them, else the node's own (Weight, Canary,
	// CanaryPercent and Cap above are what the node itself reports).
	Effective Routing `json:"effective"`
}

// Routing is how routing treats a node: its weight, canary settings and
// in-flight cap (0: none).
type Routing struct {
	// Weight is the node's weight for the weighted strategy.
	Weight int `json:"weight"`
	// Canary marks a canary node.
	Canary bool `json:"canary"`
	// CanaryPercent is the share of callers (0-100) a canary receives.
	CanaryPercent int `json:"canary_percent"`
	// Cap is the in-flight cap; 0 means none (in a policy entry: the
	// node's own).
	Cap int `json:"cap"`
}

// Dispatcher decides which node serves a request for a model and writes
// the response (locally through LocalHandler, or from a peer). stream is
// set when the request asked for server-sent events ("stream": true) or
// its answer may be large (images); otherwise the response comes in one
// small piece and may travel as one message.
type Dispatcher interface {
	// Serve answers r, whose already-read body is body, on the node it
	// picks for model (a canonical id), and says which node served it and
	// the usage that node reported (Status is left to the caller).
	Serve(w http.ResponseWriter, r *http.Request, model string, body []byte, stream bool) Served
}

// Admission authenticates callers and admits counted work.
type Admission interface {
	// Authenticate returns the request's context with the caller in it, or
	// the error to answer with (401, 403, 429).
	Authenticate(r *http.Request) (context.Context, *apierr.Error)
	// Admit counts a request for a model against the caller's limits; the
	// returned func reports how it ended (status, serving node, usage),
	// which settles the caller's budget at the real cost. body is the
	// request body when it was read (for EstimateTokens), else nil. An
	// error is 429 or 503.
	Admit(r *http.Request, model string, body []byte) (func(Served), *apierr.Error)
	// CallerKeyID is the id of the API key the authenticated caller in
	// ctx used, or "" for callers without one (the local operator, the
	// legacy listener, public probes): body shares and session caps are
	// kept per key.
	CallerKeyID(ctx context.Context) string
}

// Options configures the API.
type Options struct {
	// Backend is the node the API serves; required.
	Backend Backend
	// Logger receives request logs (debug level) and handler panics;
	// required.
	Logger *slog.Logger
	// Registry receives the API's HTTP metrics and is served whole at
	// GET /v1/server/metrics.
	Registry *prometheus.Registry
	// Clock returns the time; nil means time.Now.
	Clock func() time.Time
	// Version is sent in X-Service-Version.
	Version string
	// NodeID names this node in X-Service-Backend for locally served work.
	NodeID string
	// CORSOrigins are origins allowed for browser use; "*" allows any.
	CORSOrigins []string
	// TrustProxy honours X-Forwarded-For for the client address, as
	// written by TrustedProxies.
	TrustProxy bool
	// TrustedProxies are the networks whose X-Forwarded-For entries are
	// believed (see forwardedClient).
	TrustedProxies []*net.IPNet
	// Dispatcher routes model requests across the mesh; nil serves every
	// request on this node.
	Dispatcher Dispatcher
	// Admission authenticates and limits; nil serves everyone unlimited.
	Admission Admission
	// Governance serves the admin routes (keys, usage, state digest); nil
	// leaves them unmapped.
	Governance Governance
	// Hub serves the catalogue, pull, provenance and removal routes; nil
	// answers them 501.
	Hub ModelHub
	// Batches runs background embedding jobs.
	Batches BatchJobs
	// Dashboard mounts /dashboard when true.
	Dashboard bool
	// MeshView, when set, adds the mesh (workers, raft, usage ledger) to
	// the dashboard's data and says which callers need a key for it.
	MeshView DashboardSource
	// Bodies bounds request bodies (zero fields take the defaults).
	Bodies BodyLimits
	// Sessions bounds live sessions (zero fields take the defaults).
	Sessions SessionLimits
	// ChatServed, when set, is called after this node answered a chat
	// request in full, with the canonical model id, the request and the
	// generated message (prefix-aware routing records it).
	ChatServed func(model string, req engine.ChatRequest, answer engine.ChatMessage)
	// AuditExport and AuditKeys, when set, serve GET /v1/server/audit and
	// /v1/server/audit/keys behind admin authentication.
	AuditExport, AuditKeys http.Handler
	// ImageBudget bounds the memory decoded request images hold at once,
	// in bytes (imagecodec.DefaultBudget when 0).
	ImageBudget int64
	// Work bounds the work one request may ask and one caller may have
	// admitted at once (work.go; zero per-request fields take the
	// defaults).
	Work WorkLimits
	// WorkCaller names the share a request's work counts against; nil
	// gives no caller a share limit (only the per-request limits apply).
	WorkCaller WorkCaller
}

// Server holds the router and its dependencies.
type Server struct {
	opt     Options
	log     *slog.Logger
	metrics *metrics
	router  chi.Router
	local   chi.Router
	bodies  *bodyBudget
	bodyLim BodyLimits
	// sessions counts live sessions (sessions.go).
	sessions *sessionTable
	images   *imagecodec.Budget
	audio    *audioenc.Encoder
	work     *workMeter
}

// New builds the API router.
func New(opt Options) *Server {
	if opt.Clock == nil {
		opt.Clock = time.Now
	}
	s := &Server{opt: opt, log: opt.Logger, metrics: newMetrics(opt.Registry)}
	s.bodyLim = opt.Bodies.withDefaults()
	s.bodies = newBodyBudget(s.bodyLim)
	s.sessions = newSessionTable(opt.Sessions, opt.Registry)
	s.images = imagecodec.NewBudget(opt.ImageBudget)
	s.audio = audioenc.New()
	s.work = newWorkMeter(opt.Work)
	s.router = s.routes()
	s.local = s.localRoutes()
	return s
}

// LocalHandler serves model requests on this node's own engines, with no
// routing: the dispatcher calls it for work it keeps, and peers reach it
// through forwarding.
func (s *Server) LocalHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Route from scratch: the public router's chi context (if the
		// request came through it) must not steer the local router.
		ctx := context.WithValue(r.Context(), chi.RouteCtxKey, nil)
		s.local.ServeHTTP(w, r.WithContext(ctx))
	})
}

// InFlight is the number of requests being served now.
func (s *Server) InFlight() int64 { return s.metrics.recent.inflight() }

// Handler returns the public HTTP handler.
func (s *Server) Handler() http.Handler { return s.router }

// taskEngine returns the engine that serves task for model (empty: the
// default) and its canonical id. When there is none it writes the error,
// 404 model_not_found naming model for an unknown one, and returns false.
func (s *Server) taskEngine(w http.ResponseWriter, r *http.Request, task engine.Task, model string) (engine.Engine, string, bool) {
	return s.engineOr(w, r, task, model, func() *apierr.Error { return ModelNotFound(model) })
}

// engineOr is taskEngine with the answer for a model that is not
// installed given by notFound.
func (s *Server) engineOr(w http.ResponseWriter, r *http.Request, task engine.Task, model string, notFound func() *apierr.Error) (engine.Engine, string, bool) {
	eng, id, err := s.opt.Backend.TaskEngine(r.Context(), task, model)
	if errors.Is(err, ErrModelNotFound) {
		apierr.Write(w, notFound())
		return nil, "", false
	}
	if err != nil {
		writeErr(w, err)
		return nil, "", false
	}
	return eng, id, true
}
