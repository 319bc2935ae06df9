package onnx

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// The two OrtApi entries used here, by their index in the OrtApi table
// (the C API's ABI is append-only, so an index never changes):
// offsetof(OrtApi, AddRunConfigEntry) / sizeof(void*) = 165 and
// offsetof(OrtApi, ReleaseStatus) / sizeof(void*) = 93 in
// onnxruntime_c_api.h (API version 24, as shipped with the Go binding).
enum { apiAddRunConfigEntry = 165, apiReleaseStatus = 93, apiVersion = 16 };

typedef struct {
	const void* const* (*GetApi)(uint32_t version);
	const char* (*GetVersionString)(void);
} apiBase;

typedef void* (*addRunConfigEntryFn)(void* options, const char* key, const char* value);
typedef void (*releaseStatusFn)(void* status);

// ortApi returns the OrtApi table of the already loaded library lib, or
// NULL when it is not loaded or too old.
static const void* const* ortApi(const char* lib) {
	void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL) {
		return NULL;
	}
	const apiBase* (*getBase)(void) = (const apiBase* (*)(void))dlsym(h, "OrtGetApiBase");
	const void* const* api = NULL;
	if (getBase != NULL) {
		api = getBase()->GetApi(apiVersion);
	}
	dlclose(h); // only drops the reference dlopen took: the binding holds the library
	return api;
}

// addRunConfigEntry sets key=value on the OrtRunOptions; 0 on success.
static int addRunConfigEntry(const void* const* api, void* options, const char* key, const char* value) {
	void* st = ((addRunConfigEntryFn)api[apiAddRunConfigEntry])(options, key, value);
	if (st != NULL) {
		((releaseStatusFn)api[apiReleaseStatus])(st);
		return -1;
	}
	return 0;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	ort "github.com/yalue/onnxruntime_go"
)

// shrinkKey is ONNX Runtime's run option that shrinks the given devices'
// memory arenas at the end of a run: every arena region no tensor uses
// any more is freed (kOrtRunOptionsConfigEnableMemoryArenaShrinkage).
const shrinkKey, shrinkCPU = "memory.enable_memory_arena_shrinkage", "cpu:0"

// runOptionsPointer returns the OrtRunOptions behind ro. The Go binding
// keeps it as the struct's only field and offers no way to set a run
// option's config entry, so it is read through unsafe, after checking
// that the layout is still that one.
func runOptionsPointer(ro *ort.RunOptions) (unsafe.Pointer, error) {
	t := reflect.TypeOf(ort.RunOptions{})
	if ro == nil || t.NumField() != 1 || t.Field(0).Type.Kind() != reflect.Pointer || t.Field(0).Offset != 0 {
		return nil, errors.New("onnx: ort.RunOptions is not a single C pointer any more")
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(ro))
	if p == nil {
		return nil, errors.New("onnx: destroyed run options")
	}
	return p, nil
}

// ShrinkingRunOptions returns new run options for the runs after which a
// pipeline gives its arena back: when this handle's sessions keep the
// CPU memory arena for a while rather than for good (ArenaIdle > 0, the
// node's default), each session's arena frees at the end of a run made
// with them every region the run no longer uses; otherwise (arena "off",
// or "on": kept until unload) they are plain run options. Diffusion
// makes every run of a job with them except the denoising steps before
// the last, so a job's activations go back when it ends.
func (r *Runtime) ShrinkingRunOptions() (*ort.RunOptions, error) {
	ro, err := ort.NewRunOptions()
	if err != nil || !r.ShrinksArena() {
		return ro, err
	}
	if err := r.setShrink(ro); err != nil {
		ro.Destroy()
		return nil, err
	}
	return ro, nil
}

// ShrinksArena reports whether ShrinkingRunOptions shrinks the arena.
func (r *Runtime) ShrinksArena() bool { return r != nil && r.arena && r.idle > 0 }

// setShrink sets the shrink option on ro through the C API.
func (r *Runtime) setShrink(ro *ort.RunOptions) error {
	p, err := runOptionsPointer(ro)
	if err != nil {
		return err
	}
	lib := C.CString(r.cfg.LibraryPath)
	defer C.free(unsafe.Pointer(lib))
	api := C.ortApi(lib)
	if api == nil {
		return fmt.Errorf("onnx: %s: no OrtApi (library not loaded or older than API %d)", r.cfg.LibraryPath, C.apiVersion)
	}
	k, v := C.CString(shrinkKey), C.CString(shrinkCPU)
	defer C.free(unsafe.Pointer(k))
	defer C.free(unsafe.Pointer(v))
	if C.addRunConfigEntry(api, p, k, v) != 0 {
		return fmt.Errorf("onnx: run option %s=%s refused", shrinkKey, shrinkCPU)
	}
	return nil
}
