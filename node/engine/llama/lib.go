// Package llama binds llama.cpp's C API, loaded at run time from the
// shared libraries that scripts/assets-llama.sh installs (the npm package
// @node-llama-cpp/linux-x64: libllama, libggml, libggml-base and one
// libggml-cpu-<variant> per x64 CPU generation). Only the functions the
// gguf engine calls are declared, as function pointers filled by dlsym;
// no llama.cpp source or header is part of the repository.
//
// Structs passed by value (llama_context_params, llama_model_params) are
// kept as opaque byte blocks filled by the library's own
// *_default_params(); the fields this package sets are written at offsets
// that Open checks against those defaults (see layout.go), so a library
// whose layout differs is refused at load with an error naming the field,
// instead of being called with a struct it would misread.
package llama

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// Library file names inside the directory scripts/assets-llama.sh fills.
const (
	libLlama = "libllama.v0.4.0.so"
	libGGML  = "libggml.v0.4.0.so"
	libBase  = "libggml-base.so"
)

// Lib is llama.cpp loaded from one directory. The shared libraries stay
// mapped for the life of the process (dlopen counts references; the CPU
// backend registry is the library's own), so a Lib holds no resource that
// needs closing beyond its function table, freed by Close.
type Lib struct {
	api     *C.lm_api
	dir     string
	version string
	layout  layout

	mu   sync.Mutex
	refs int // Open's own reference plus one per loaded model
}

// Open loads libllama and libggml from dir, loads the CPU backend that
// fits this machine and checks the struct layouts this package relies on
// against the library's own defaults. A library that lacks a function,
// or whose layout differs, is refused with an error saying what differs.
func Open(dir string) (*Lib, error) {
	for _, f := range []string{libBase, libGGML, libLlama} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("llama: %s not found in %s (run `make assets`): %w", f, dir, err)
		}
	}
	api := (*C.lm_api)(C.calloc(1, C.size_t(unsafe.Sizeof(C.lm_api{}))))
	cBase, cGGML, cLlama, cDir := C.CString(filepath.Join(dir, libBase)), C.CString(filepath.Join(dir, libGGML)), C.CString(filepath.Join(dir, libLlama)), C.CString(dir)
	defer func() {
		for _, p := range []*C.char{cBase, cGGML, cLlama, cDir} {
			C.free(unsafe.Pointer(p))
		}
	}()
	var missing *C.char
	if msg := C.lm_open(api, cBase, cGGML, cLlama, &missing); msg != nil {
		err := C.GoString(msg)
		if missing != nil {
			err += ": " + C.GoString(missing)
		}
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("llama: load %s: %s", dir, err)
	}
	if msg := C.lm_load_backends(api, cDir); msg != nil {
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("llama: %s: %s", dir, C.GoString(msg))
	}
	l := &Lib{api: api, dir: dir, version: C.GoString(C.lm_version(api)), refs: 1}
	lay, err := l.checkLayout()
	if err != nil {
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("llama: %s (llama.cpp %s) does not match this binding, refusing to use it: %w", dir, l.version, err)
	}
	l.layout = lay
	return l, nil
}

// Version is llama_version(): the llama.cpp version the library was built from.
func (l *Lib) Version() string { return l.version }

// Close drops Open's reference: the function table is freed once every
// model loaded from the library is freed too, so closing the library
// before its engines is safe.
func (l *Lib) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refs == 0 {
		return
	}
	l.refs--
	l.releaseLocked()
}

// open reports whether Close has not been called yet.
func (l *Lib) open() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.api != nil && l.refs > 0
}

// hold takes a reference for a loaded model.
func (l *Lib) hold() {
	l.mu.Lock()
	l.refs++
	l.mu.Unlock()
}

// release drops a model's reference.
func (l *Lib) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refs--
	l.releaseLocked()
}

func (l *Lib) releaseLocked() {
	if l.refs == 0 && l.api != nil {
		C.free(unsafe.Pointer(l.api))
		l.api = nil
	}
}

// errClosed is returned by calls on a freed model or context.
var errClosed = errors.New("llama: use of a closed library or a freed model or context")
