package dockerplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
)

// contentType is the content type of every answer, as Docker's plugin
// helpers send it.
const contentType = "application/vnd.docker.plugins.v1.1+json"

// maxRequestBody caps a request body. The largest request, Create, is a
// name and its options: far smaller.
const maxRequestBody = 1 << 20

// maxInFlight caps the calls served at a time; more wait for a slot
// within their deadline.
const maxInFlight = 64

// request is the body of every call: each endpoint reads the fields it
// takes (Name; ID for Mount and Unmount; Opts for Create).
type request struct {
	Name string
	ID   string
	Opts map[string]string
}

// endpoint serves one call and returns the answer's body.
type endpoint func(ctx context.Context, req *request) (any, error)

// endpoints maps the protocol's paths to their endpoints.
func (s *Server) endpoints() map[string]endpoint {
	return map[string]endpoint{
		"/Plugin.Activate":           s.activate,
		"/VolumeDriver.Create":       s.create,
		"/VolumeDriver.Remove":       s.remove,
		"/VolumeDriver.Mount":        s.mount,
		"/VolumeDriver.Unmount":      s.unmount,
		"/VolumeDriver.Path":         s.path,
		"/VolumeDriver.Get":          s.get,
		"/VolumeDriver.List":         s.list,
		"/VolumeDriver.Capabilities": s.capabilities,
	}
}

// errorBody is the body of every error answer.
type errorBody struct {
	Err string
}

// serveHTTP serves one call: it finds the endpoint, reads the request
// within the caps and answers the endpoint's result or {"Err"}.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.inFlight.Add(1)
	defer s.inFlight.Done()
	started := time.Now()
	ep, ok := s.routes[r.URL.Path]
	if !ok {
		s.fail(w, r, http.StatusNotFound, nil, fmt.Errorf("unknown endpoint %s: this socket serves csisupd's Docker volume plugin (%s)",
			r.URL.Path, strings.Join(slices.Sorted(maps.Keys(s.routes)), ", ")))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.fail(w, r, http.StatusMethodNotAllowed, nil, fmt.Errorf("%s takes POST, not %s", r.URL.Path, r.Method))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	req, err := readRequest(w, r)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, nil, err)
		return
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	case <-ctx.Done():
		s.fail(w, r, http.StatusInternalServerError, req, fmt.Errorf("%s: more than %d calls in flight for %s; retry", r.URL.Path, maxInFlight, requestTimeout))
		return
	}
	resp, err := ep(ctx, req)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, req, err)
		return
	}
	s.logger.Debug("call", "endpoint", r.URL.Path, "name", req.Name, "id", req.ID, "opts", optKeys(req.Opts), "took", time.Since(started))
	writeJSON(w, http.StatusOK, resp)
}

// readRequest reads the request's JSON body, at most maxRequestBody
// bytes. An empty body is an empty request: Docker and Podman send none
// to Activate, List and Capabilities.
func readRequest(w http.ResponseWriter, r *http.Request) (*request, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, fmt.Errorf("%s: the request body is larger than %d bytes", r.URL.Path, maxRequestBody)
	case err != nil:
		return nil, fmt.Errorf("%s: read the request body: %w", r.URL.Path, err)
	}
	req := &request{}
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	if err := json.Unmarshal(body, req); err != nil {
		return nil, fmt.Errorf("%s: the request body is not the JSON object of the volume plugin protocol ({\"Name\": ..., \"ID\": ..., \"Opts\": {...}}): %w", r.URL.Path, err)
	}
	return req, nil
}

// fail answers err as {"Err"} with status and logs it (warn); req, when
// read, names the volume. Option values are never logged: only keys.
// A Get of a volume that does not exist is how engines ask before they
// create one: it is logged at debug.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, req *request, err error) {
	if req == nil {
		req = &request{}
	}
	log := s.logger.Warn
	if r.URL.Path == "/VolumeDriver.Get" && isNotFound(err) {
		log = s.logger.Debug
	}
	log("call failed", "endpoint", r.URL.Path, "name", req.Name, "id", req.ID, "opts", optKeys(req.Opts), "error", err)
	writeJSON(w, status, errorBody{Err: err.Error()})
}

// writeJSON writes body as the answer, with the plugins' content type.
func writeJSON(w http.ResponseWriter, status int, body any) {
	data, err := json.Marshal(body)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = json.Marshal(errorBody{Err: fmt.Sprintf("encode the answer: %v", err)})
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// optKeys returns the sorted keys of opts, for logs: values may be
// anything a user typed.
func optKeys(opts map[string]string) []string {
	if len(opts) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(opts))
}
