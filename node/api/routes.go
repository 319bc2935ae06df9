package api

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Paths the spec names as unsupported; they answer 404 unknown_url like any
// unknown path, listed here so a test can walk them.
var UnsupportedPaths = []string{
	"/v1/responses", "/v1/completions", "/v1/moderations", "/v1/files",
	"/v1/fine_tuning/jobs", "/v1/assistants", "/v1/threads",
}

func (s *Server) routes() chi.Router {
	r := chi.NewRouter()
	r.Use(s.common, s.cors, s.authenticate, s.gateBodies)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeUnknownURL, "",
			fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		if allow := s.allowedMethods(r.URL.Path); allow != "" {
			w.Header().Set("Allow", allow)
		}
		apierr.Write(w, apierr.New(http.StatusMethodNotAllowed, apierr.TypeInvalidRequest, apierr.CodeMethodNotAllowed, "",
			fmt.Sprintf("Method %s is not allowed for %s.", r.Method, r.URL.Path)))
	})

	r.Get("/readyz", s.readyz)
	r.Get("/livez", s.livez)
	s.registerBuildInfo()
	if s.opt.Dashboard {
		r.Get("/dashboard", s.dashboard)
		r.Get("/dashboard/data", s.dashboardData)
	}
	r.Route("/v1", func(r chi.Router) {
		r.Use(s.refuseWhileDraining)
		s.modelRoutes(r, true)
		r.Post("/batch/embeddings", s.submitBatch)
		r.Get("/batch/embeddings", s.listBatches)
		r.Get("/batch/embeddings/{id}", s.getBatch)
		r.Delete("/batch/embeddings/{id}", s.cancelBatch)

		s.hubRoutes(r)
		r.Get("/models", s.listModels)
		r.Get("/models/installed", s.installedModels)
		r.Get("/models/{id}", s.getModel)
		// Canonical ids contain slashes: <runtime>/<family>/<variant>.
		r.Get("/models/{runtime}/{family}/{variant}", s.getModel)

		s.adminRoutes(r)
		r.Get("/server/members", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": s.opt.Backend.Members()})
		})
		r.Get("/server/metrics", promhttp.HandlerFor(s.opt.Registry, promhttp.HandlerOpts{}).ServeHTTP)
	})
	return r
}

// modelRoutes mounts the JSON routes that run a model. On the public router
// (routed) they go through the dispatcher; on the local router they run here.
func (s *Server) modelRoutes(r chi.Router, routed bool) {
	// small marks routes whose one-piece answers are small enough to
	// forward as one message (embeddings, chat); image answers can run to
	// tens of MiB and always travel as streams.
	wrap := func(limit int64, task string, small bool, h http.HandlerFunc) http.HandlerFunc {
		if !routed || s.opt.Dispatcher == nil {
			return h
		}
		return s.routed(limit, task, small, h, nil)
	}
	// wrapParsed is wrap for a route whose body routed decodes strictly
	// once, for the handler too when this node serves the request.
	wrapParsed := func(limit int64, small bool, h http.HandlerFunc, pre preparse) http.HandlerFunc {
		if !routed || s.opt.Dispatcher == nil {
			return h
		}
		return s.routed(limit, "", small, h, pre)
	}
	r.Post("/embeddings", wrapParsed(MaxJSONBody, true, s.embeddings,
		parseOnce(parseEmbeddings, func(p *parsedEmbeddings) (string, bool) { return p.Model, false })))
	r.Post("/vision/background", wrap(MaxImageBody, "background-removal", false, s.visionBackground))
	r.Post("/vision/detections", wrap(MaxImageBody, string(engine.TaskObjectDetection), false, s.visionDetections))
	r.Post("/vision/faces", wrap(MaxImageBody, string(engine.TaskFaceDetection), false, s.visionFaces))
	r.Post("/chat/completions", wrapParsed(MaxImageBody, true, s.chatCompletions,
		parseOnce(parseChat, func(p *parsedChat) (string, bool) { return p.Model, p.Stream })))
	r.Post("/images/generations", wrap(MaxImageBody, "", false, s.imagesGenerations))
	r.Post("/images/edits", wrap(MaxImageBody, "", false, s.imagesEdits))
	r.Post("/images/variations", wrap(MaxImageBody, "", false, s.imagesVariations))
	r.Post("/audio/transcriptions", wrap(MaxAudioFileBytes+1<<20, "", false, s.audioTranscriptions))
	r.Post("/audio/translations", wrap(MaxAudioFileBytes+1<<20, "", false, s.audioTranslations))
	r.Post("/images/describe", wrap(MaxImageBody, string(engine.TaskImageDescription), false, s.imagesDescribe))
	r.Post("/audio/speech", wrap(MaxJSONBody, "", false, s.audioSpeech))
	r.Get("/audio/voices", wrap(MaxJSONBody, "", true, s.audioVoices))
	live := stripLiveKey(wrap(MaxJSONBody, "", false, s.liveTranscriptions))
	if routed {
		live = s.liveEntry(live)
	}
	r.Get("/audio/transcriptions/stream", live)
	r.Post("/audio/clone", wrap(MaxAudioFileBytes+1<<20, "", false, s.audioClone))
}

// localRoutes is the router behind LocalHandler: model routes only, no
// routing, no caller-facing headers (the entry node sets those).
func (s *Server) localRoutes() chi.Router {
	r := chi.NewRouter()
	r.Use(s.recoverOnly)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeUnknownURL, "",
			fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)))
	})
	r.Route("/v1", func(r chi.Router) {
		s.modelRoutes(r, false)
		r.Post("/models/pull", s.pullLocal)
		s.appliedRoutes(r)
	})
	return r
}

// preparse decodes a routed route's body strictly: the parsed request,
// its model and whether it streams; ok is false when the body does not
// parse (routed then peeks, and the handler reports the error).
type preparse func(body []byte) (v any, model string, stream bool, ok bool)

// parseOnce makes a route's strict parser a preparse; route names the
// parsed request's model and whether it streams.
func parseOnce[T any](parse func([]byte) (T, error), route func(T) (string, bool)) preparse {
	return func(body []byte) (any, string, bool, bool) {
		v, err := parse(body)
		if err != nil {
			return nil, "", false, false
		}
		model, stream := route(v)
		return v, model, stream, true
	}
}

// routed reads the body, finds the model the request is for and hands it
// to the dispatcher. A request whose model no node serves, or whose body
// cannot be read for a model, is answered here by the local handler, which
// gives the precise error. With pre, a body that decodes strictly is
// decoded once: the parsed request travels with the resolved model to the
// handler when this node serves it.
func (s *Server) routed(limit int64, defaultTask string, small bool, h http.HandlerFunc, pre preparse) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(r, limit)
		if err != nil {
			writeErr(w, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var model string
		var stream, parsedOK bool
		var parsed any
		switch {
		case strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/"):
			model, stream = peekForm(body, r.Header.Get("Content-Type"))
		case len(body) == 0 && r.Method == http.MethodGet:
			model = r.URL.Query().Get("model") // GET routes name the model in the query
		default:
			if pre != nil {
				parsed, model, stream, parsedOK = pre(body)
			}
			if !parsedOK {
				model, stream, _ = peekRoute(body)
			}
		}
		m, verdict := s.opt.Backend.Route(model, defaultTask)
		switch verdict {
		case VerdictBlocked:
			apierr.Write(w, apierr.New(http.StatusForbidden, apierr.TypePermission, apierr.CodeModelBlocked, "model",
				fmt.Sprintf("The model '%s' is blocked by the pool policy.", model)))
			return
		case VerdictDraining:
			// Every node that holds the model is draining (this one
			// included): a retry elsewhere or later will find one.
			apierr.Write(w, drainingError())
			return
		case VerdictLocal:
			h(w, r)
			return
		}
		// The handler, when this node serves the request, takes the model
		// resolved here instead of resolving it again.
		if model != "" {
			r = r.WithContext(withRouted(r.Context(), model, m, parsed))
		}
		markDeprecated(w, m)
		sw := &statusWriter{ResponseWriter: w}
		done, e := s.admit(r, m.ID, body)
		if e != nil {
			apierr.Write(w, e)
			return
		}
		var served Served
		if done != nil {
			defer func() { served.Status = sw.code(); done(served) }()
		}
		served = s.opt.Dispatcher.Serve(sw, r, m.ID, body, stream || !small)
		// Pass the usage on to whatever carries this response (the
		// forward server's writer on a node serving a peer's request),
		// so it reaches the node that admitted the request.
		reportUsage(w, served.PromptTokens, served.CompletionTokens)
		if served.Aborted {
			panic(http.ErrAbortHandler) // after the deferred accounting
		}
	}
}

// allowedMethods lists the methods the public router serves at path, for
// the Allow header of a 405.
func (s *Server) allowedMethods(path string) string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		if s.router != nil && s.router.Match(chi.NewRouteContext(), m, path) {
			out = append(out, m)
		}
	}
	return strings.Join(out, ", ")
}
