package api

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"
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
	r.Use(s.common, s.cors)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, Errorf(http.StatusNotFound, TypeInvalidRequest, CodeUnknownURL, "",
			fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, Errorf(http.StatusMethodNotAllowed, TypeInvalidRequest, CodeMethodNotAllowed, "",
			fmt.Sprintf("Method %s is not allowed for %s.", r.Method, r.URL.Path)))
	})

	r.Get("/readyz", s.readyz)
	if s.opt.Dashboard {
		r.Get("/dashboard", s.dashboard)
		r.Get("/dashboard/data", s.dashboardData)
	}
	r.Route("/v1", func(r chi.Router) {
		r.Use(s.refuseWhileDraining)
		r.Post("/embeddings", s.embeddings)
		r.Post("/vision/background", s.visionBackground)
		r.Post("/vision/detections", s.noVisionEngine)
		r.Post("/vision/faces", s.noVisionEngine)

		r.Post("/chat/completions", s.jsonModelRoute("chat"))
		r.Post("/batch/embeddings", s.submitBatch)
		r.Get("/batch/embeddings", s.listBatches)
		r.Get("/batch/embeddings/{id}", s.getBatch)
		r.Delete("/batch/embeddings/{id}", s.cancelBatch)
		r.Post("/images/generations", s.jsonModelRoute("image generation"))
		r.Post("/images/describe", s.jsonModelRoute("image description"))
		r.Post("/audio/speech", s.jsonModelRoute("text-to-speech"))
		r.Post("/audio/transcriptions", s.formModelRoute("speech-to-text"))
		r.Post("/audio/translations", s.formModelRoute("speech translation"))
		r.Post("/audio/clone", s.formModelRoute("voice cloning"))
		r.Get("/audio/transcriptions/stream", s.queryModelRoute("live speech-to-text"))

		r.Get("/models", s.listModels)
		r.Get("/models/installed", s.installedModels)
		r.Get("/models/{id}", s.getModel)
		// Canonical ids contain slashes: <runtime>/<family>/<variant>.
		r.Get("/models/{runtime}/{family}/{variant}", s.getModel)

		r.Get("/server/metrics", promhttp.HandlerFor(s.opt.Registry, promhttp.HandlerOpts{}).ServeHTTP)
	})
	return r
}
